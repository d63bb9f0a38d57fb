// cuda::Graph (see core/cuda/graph.h), compiled only with the CUDA backend. Capture uses
// cudaStreamCaptureModeThreadLocal so other threads (DataLoader workers, the NCCL/Gloo workers)
// may keep calling CUDA while one thread captures. The capturing thread allocates from a private
// pool of the device's caching allocator (core/allocator.h), held until reset() or destruction,
// after the stream has drained every replay; a miss inside the capture calls cudaMalloc in relaxed
// capture mode (core/cuda/runtime.cpp). Kernels that may write the deferred error record
// (core/cuda/context.h) mark it during capture; the graph remembers that and re-arms the check
// after each replay, so the next device-to-host copy reports an error a replay found. Random
// kernels (dropout) captured read their seed through the graph's replay counter (context.h),
// registered while the capture is open; when one did, end_capture adds the kernel that advances
// the counter as the graph's last node, so every replay draws new numbers.
#include "core/cuda/graph.h"

#include <cuda_runtime.h>

#include <string>

#include "core/allocator.h"
#include "core/cuda/context.h"

namespace tandem::cuda {

struct Graph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool capturing = false;
  CachingAllocator::PoolId pool = 0;  // the capture's private pool, 0 if none
  uint64_t marks_at_begin = 0;        // kernel_error_marks when the capture began
  bool may_report = false;            // the captured work may write the deferred error record
  uint64_t* replay_counter = nullptr;  // device memory, made by the first capture, zeroed once
  void clear() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
  }
  ~Impl() { clear(); }
};

Graph::Graph(int device) : device_(device), impl_(std::make_unique<Impl>()) { check_device_index(device); }

Graph::~Graph() {
  if (!impl_) return;
  try {
    DeviceGuard guard(device_);
    if (impl_->capturing) {  // abandon a capture left open by an exception
      (void)set_capture_replay_counter(device_, nullptr);
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(compute_stream(device_), &g);
      if (g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
      cuda_allocator(device_).end_private_pool();
    }
    release_memory();  // waits for the replays, which read the counter
    if (impl_->replay_counter && cudaFree(impl_->replay_counter) != cudaSuccess) (void)cudaGetLastError();
  } catch (...) {
    // A destructor never throws; at worst the pool's blocks stay reserved.
  }
}

// Waits for queued replays, then hands the private pool's blocks back to the shared cache.
void Graph::release_memory() {
  impl_->clear();
  if (impl_->pool == 0) return;
  DeviceGuard guard(device_);
  stream_synchronize(compute_stream(device_));
  cuda_allocator(device_).release_private_pool(impl_->pool);
  impl_->pool = 0;
}

void Graph::begin_capture() {
  TANDEM_CHECK(!impl_->capturing, "cuda::Graph::begin_capture: a capture is already open on cuda:", device_);
  release_memory();
  // Made before the capture: their first use allocates and synchronises, which a capture forbids.
  prepare_kernel_error_record(device_);
  DeviceGuard guard(device_);
  if (impl_->replay_counter == nullptr) {  // zeroed on the compute stream, so ahead of every replay
    void* p = nullptr;
    TANDEM_CUDA_CHECK(cudaMalloc(&p, sizeof(uint64_t)));
    impl_->replay_counter = static_cast<uint64_t*>(p);
    TANDEM_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(uint64_t), compute_stream(device_)));
  }
  CachingAllocator& alloc = cuda_allocator(device_);
  impl_->pool = alloc.begin_private_pool();
  impl_->marks_at_begin = kernel_error_marks(device_);
  const cudaError_t err = cudaStreamBeginCapture(compute_stream(device_), cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    alloc.end_private_pool();
    TANDEM_CUDA_CHECK(err);
  }
  impl_->capturing = true;
  (void)set_capture_replay_counter(device_, impl_->replay_counter);
}

void Graph::end_capture() {
  TANDEM_CHECK(impl_->capturing, "cuda::Graph::end_capture: no capture open on cuda:", device_,
               " (call begin_capture first)");
  DeviceGuard guard(device_);
  impl_->capturing = false;
  // The counter's advance comes last, after every captured kernel that reads it.
  std::string advance_error;
  if (set_capture_replay_counter(device_, nullptr)) {
    try {
      queue_replay_counter_advance(device_, impl_->replay_counter);
    } catch (const Error& e) {
      advance_error = e.what();
    }
  }
  const cudaError_t err = cudaStreamEndCapture(compute_stream(device_), &impl_->graph);
  cuda_allocator(device_).end_private_pool();
  impl_->may_report = kernel_error_marks(device_) != impl_->marks_at_begin;
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    impl_->clear();
    TANDEM_FAIL("cuda::Graph::end_capture on cuda:", device_, " failed: ", cudaGetErrorString(err),
                " (the captured step synchronised with the host or allocated memory outside the cache: run "
                "warm-up steps first and keep .item() and GradScaler::step out of the captured region)");
  }
  if (!advance_error.empty()) {
    impl_->clear();
    TANDEM_FAIL("cuda::Graph::end_capture on cuda:", device_, ": the kernel advancing the random kernels' replay "
                "counter could not be captured: ", advance_error);
  }
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, impl_->graph, 0));
}

void Graph::replay() {
  TANDEM_CHECK(impl_->exec != nullptr, "cuda::Graph::replay: nothing captured on cuda:", device_);
  DeviceGuard guard(device_);
  TANDEM_CUDA_CHECK(cudaGraphLaunch(impl_->exec, compute_stream(device_)));
  if (impl_->may_report) mark_kernel_error_check_pending(device_);
}

void Graph::reset() {
  TANDEM_CHECK(!impl_->capturing, "cuda::Graph::reset: a capture is open on cuda:", device_);
  release_memory();
}

bool Graph::captured() const { return impl_->exec != nullptr; }

bool Graph::supported() { return true; }

}  // namespace tandem::cuda
