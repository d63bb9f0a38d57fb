// cuDNN and cuBLAS handles per (host thread, device), bound to the device's compute stream, and the
// small host helpers of kernels/cuda (see common.h). Handles live for the whole process on purpose:
// destroying them from static destructors would race the CUDA runtime's own teardown.
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cuda/common.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kMaxDevices = 64;

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

cudnnHandle_t cudnn_handle(int device) {
  check_device_index(device);
  cudnnHandle_t& h = t_handles.cudnn[device];
  if (h) return h;
  cudnnHandle_t fresh = take_pooled(handle_pool().cudnn[device]);
  if (!fresh) {
    StreamGuard on(device);
    TANDEM_CUDNN_CHECK(cudnnCreate(&fresh));
    TANDEM_CUDNN_CHECK(cudnnSetStream(fresh, on.stream()));
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
    StreamGuard on(device);
    TANDEM_CUBLAS_CHECK(cublasCreate(&fresh));
    TANDEM_CUBLAS_CHECK(cublasSetStream(fresh, on.stream()));
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

namespace {

// Every defined tensor on one CUDA device, each of a dtype `allowed` admits and all of one dtype.
template <typename Allowed>
int check_cuda_operands(const char* op, std::initializer_list<Tensor> tensors, Allowed allowed, const char* expected) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    TANDEM_CHECK(t.device().is_cuda(), op, ": expected a CUDA tensor, got ", t.str());
    TANDEM_CHECK(allowed(t.dtype()), op, ": the CUDA kernel takes ", expected, ", got ", t.str());
    if (!first) {
      first = &t;
      continue;
    }
    TANDEM_CHECK(t.device() == first->device(), op, ": expected all tensors on ", first->device().str(),
                 ", got ", t.str());
    TANDEM_CHECK(t.dtype() == first->dtype(), op, ": expected all tensors as ", dtype_name(first->dtype()),
                 ", got ", t.str());
  }
  TANDEM_CHECK(first != nullptr, op, ": no tensor given");
  check_device_index(first->device().index);
  return first->device().index;
}

}  // namespace

int check_f32_cuda(const char* op, std::initializer_list<Tensor> tensors) {
  return check_cuda_operands(op, tensors, [](DType d) { return d == kFloat32; }, "float32 only");
}

int check_f32_f64_cuda(const char* op, std::initializer_list<Tensor> tensors) {
  return check_cuda_operands(op, tensors, [](DType d) { return d == kFloat32 || d == kFloat64; },
                             "float32 or float64");
}

int to_int(int64_t v, const char* op, const char* what) {
  TANDEM_CHECK(v >= 0 && v <= INT_MAX, op, ": ", what, " = ", v, " is outside [0, ", INT_MAX,
               "], which cuDNN/cuBLAS need");
  return static_cast<int>(v);
}

}  // namespace tandem::kernels::cuda
