// cuda::Graph (see core/cuda/graph.h), compiled only with the CUDA backend. Capture uses
// cudaStreamCaptureModeThreadLocal so other threads (DataLoader workers, the NCCL/Gloo workers)
// may keep calling CUDA while one thread captures; the caching allocator's cudaMalloc on a cache
// miss would be illegal inside the capture and is reported as the capture's error.
#include "core/cuda/graph.h"

#include <cuda_runtime.h>

#include "kernels/cuda/context.h"

namespace tandem::cuda {

struct Graph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool capturing = false;
  void clear() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
  }
  ~Impl() { clear(); }
};

Graph::Graph(int device) : device_(device), impl_(std::make_unique<Impl>()) {
  kernels::cuda::check_device_index(device);
}

Graph::~Graph() {
  if (impl_ && impl_->capturing) {  // abandon a capture left open by an exception
    cudaGraph_t g = nullptr;
    kernels::cuda::DeviceGuard guard(device_);
    (void)cudaStreamEndCapture(kernels::cuda::compute_stream(device_), &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
}

void Graph::begin_capture() {
  TANDEM_CHECK(!impl_->capturing, "cuda::Graph::begin_capture: a capture is already open on cuda:", device_);
  impl_->clear();
  kernels::cuda::DeviceGuard guard(device_);
  TANDEM_CUDA_CHECK(
      cudaStreamBeginCapture(kernels::cuda::compute_stream(device_), cudaStreamCaptureModeThreadLocal));
  impl_->capturing = true;
}

void Graph::end_capture() {
  TANDEM_CHECK(impl_->capturing, "cuda::Graph::end_capture: no capture open on cuda:", device_,
               " (call begin_capture first)");
  kernels::cuda::DeviceGuard guard(device_);
  impl_->capturing = false;
  const cudaError_t err = cudaStreamEndCapture(kernels::cuda::compute_stream(device_), &impl_->graph);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    impl_->clear();
    TANDEM_FAIL("cuda::Graph::end_capture on cuda:", device_, " failed: ", cudaGetErrorString(err),
                " (the captured step synchronised with the host or allocated memory outside the cache: run "
                "warm-up steps first and keep .item() and GradScaler::step out of the captured region)");
  }
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, impl_->graph, 0));
}

void Graph::replay() {
  TANDEM_CHECK(impl_->exec != nullptr, "cuda::Graph::replay: nothing captured on cuda:", device_);
  kernels::cuda::DeviceGuard guard(device_);
  TANDEM_CUDA_CHECK(cudaGraphLaunch(impl_->exec, kernels::cuda::compute_stream(device_)));
}

void Graph::reset() {
  TANDEM_CHECK(!impl_->capturing, "cuda::Graph::reset: a capture is open on cuda:", device_);
  impl_->clear();
}

bool Graph::captured() const { return impl_->exec != nullptr; }

bool Graph::supported() { return true; }

}  // namespace tandem::cuda
