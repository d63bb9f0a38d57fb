// Per-device CUDA state: compute streams, per-thread cuDNN/cuBLAS handles bound to them, the
// deferred kernel-error record, and the small host helpers of kernels/cuda. See context.h for the
// contract. Streams, handles and records live for the whole process on purpose: destroying them
// from static destructors would race the CUDA runtime's own teardown.
#include "kernels/cuda/context.h"

#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/device.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct PerDevice {
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;
  std::once_flag record_once;
  KernelErrorRecord* record = nullptr;
  std::atomic<bool> error_check_pending{false};
};

std::array<PerDevice, kMaxDevices>& per_device() {
  static auto* state = new std::array<PerDevice, kMaxDevices>();  // leaked, see the file comment
  return *state;
}

// Handles returned by threads that ended, ready for reuse by new threads (leaked with the process).
struct HandlePool {
  std::mutex mu;
  std::array<std::vector<cudnnHandle_t>, kMaxDevices> cudnn;
  std::array<std::vector<cublasHandle_t>, kMaxDevices> cublas;
};

HandlePool& handle_pool() {
  static auto* pool = new HandlePool();
  return *pool;
}

// The calling thread's handles; given back to the pool when the thread ends (no CUDA call there).
struct ThreadHandles {
  std::array<cudnnHandle_t, kMaxDevices> cudnn{};
  std::array<cublasHandle_t, kMaxDevices> cublas{};
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (int d = 0; d < kMaxDevices; ++d) {
      if (cudnn[d]) pool.cudnn[d].push_back(cudnn[d]);
      if (cublas[d]) pool.cublas[d].push_back(cublas[d]);
    }
  }
};

thread_local ThreadHandles t_handles;

template <typename H>
H take_pooled(std::vector<H>& from) {
  std::lock_guard<std::mutex> lock(handle_pool().mu);
  if (from.empty()) return nullptr;
  H h = from.back();
  from.pop_back();
  return h;
}

}  // namespace

void check_device_index(int device) {
  const int count = tandem::cuda_device_count();
  TANDEM_CHECK(device >= 0 && device < count, "CUDA device cuda:", device, " requested but ", count,
               " device(s) are visible", count == 0 ? " (no driver, no GPU, or CUDA_VISIBLE_DEVICES hides them)" : "");
  TANDEM_CHECK(device < kMaxDevices, "CUDA device index ", device, " above the supported maximum ",
               kMaxDevices - 1);
}

DeviceGuard::DeviceGuard(int device) {
  TANDEM_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    TANDEM_CUDA_CHECK(cudaSetDevice(device));
  } else {
    previous_ = -1;  // nothing to restore
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // a destructor must not throw
}

cudaStream_t compute_stream(int device) {
  check_device_index(device);
  PerDevice& pd = per_device()[device];
  std::call_once(pd.stream_once, [&] {
    DeviceGuard guard(device);
    cudaStream_t s = nullptr;
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    pd.stream = s;
  });
  return pd.stream;
}

cudnnHandle_t cudnn_handle(int device) {
  check_device_index(device);
  cudnnHandle_t& h = t_handles.cudnn[device];
  if (h) return h;
  cudnnHandle_t fresh = take_pooled(handle_pool().cudnn[device]);
  if (!fresh) {
    const cudaStream_t stream = compute_stream(device);
    DeviceGuard guard(device);
    TANDEM_CUDNN_CHECK(cudnnCreate(&fresh));
    TANDEM_CUDNN_CHECK(cudnnSetStream(fresh, stream));
  }
  h = fresh;
  return h;
}

cublasHandle_t cublas_handle(int device) {
  check_device_index(device);
  cublasHandle_t& h = t_handles.cublas[device];
  if (h) return h;
  cublasHandle_t fresh = take_pooled(handle_pool().cublas[device]);
  if (!fresh) {
    const cudaStream_t stream = compute_stream(device);
    DeviceGuard guard(device);
    TANDEM_CUBLAS_CHECK(cublasCreate(&fresh));
    TANDEM_CUBLAS_CHECK(cublasSetStream(fresh, stream));
    TANDEM_CUBLAS_CHECK(cublasSetMathMode(fresh, allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  }
  h = fresh;
  return h;
}

bool allow_tf32() {
  static const bool allowed = [] {
    const char* v = std::getenv("TANDEM_ALLOW_TF32");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return allowed;
}

KernelErrorRecord* kernel_error_record(int device) {
  const cudaStream_t stream = compute_stream(device);
  PerDevice& pd = per_device()[device];
  std::call_once(pd.record_once, [&] {
    DeviceGuard guard(device);
    void* p = nullptr;
    TANDEM_CUDA_CHECK(cudaMalloc(&p, sizeof(KernelErrorRecord)));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(KernelErrorRecord), stream));
    pd.record = static_cast<KernelErrorRecord*>(p);
  });
  return pd.record;
}

void mark_kernel_error_check_pending(int device) {
  per_device()[device].error_check_pending.store(true, std::memory_order_release);
}

void check_kernel_errors(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  PerDevice& pd = per_device()[device];
  if (!pd.error_check_pending.exchange(false, std::memory_order_acq_rel)) return;
  const cudaStream_t stream = compute_stream(device);
  KernelErrorRecord* rec = kernel_error_record(device);
  KernelErrorRecord host{};
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(&host, rec, sizeof(host), cudaMemcpyDeviceToHost, stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host.code == kNoKernelError) return;
  TANDEM_CUDA_CHECK(cudaMemsetAsync(rec, 0, sizeof(KernelErrorRecord), stream));
  switch (host.code) {
    case kNllTargetOutOfRange:
      TANDEM_FAIL("nll_loss: target ", host.b, " at row ", host.a, " is out of range, expected a class in [0, ",
                  host.c, ") (found by the CUDA kernel on cuda:", device,
                  "; reported at the next read of a result from that device)");
    default:
      TANDEM_FAIL("a CUDA kernel on cuda:", device, " reported error code ", host.code);
  }
}

int check_f32_cuda(const char* op, std::initializer_list<Tensor> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    TANDEM_CHECK(t.device().is_cuda(), op, ": expected a CUDA tensor, got ", t.str());
    TANDEM_CHECK(t.dtype() == kFloat32, op, ": the CUDA kernels support float32 only, got ", t.str());
    if (!first) {
      first = &t;
      continue;
    }
    TANDEM_CHECK(t.device() == first->device(), op, ": expected all tensors on ", first->device().str(),
                 ", got ", t.str());
  }
  TANDEM_CHECK(first != nullptr, op, ": no tensor given");
  check_device_index(first->device().index);
  return first->device().index;
}

int to_int(int64_t v, const char* op, const char* what) {
  TANDEM_CHECK(v >= 0 && v <= INT_MAX, op, ": ", what, " = ", v, " is outside [0, ", INT_MAX,
               "], which cuDNN/cuBLAS need");
  return static_cast<int>(v);
}

}  // namespace tandem::kernels::cuda
