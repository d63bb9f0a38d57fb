// Internal to kernels/cuda (and the GPU tests); never included by a public header. What the CUDA
// kernels share on top of core/cuda/context.h (streams, guards, launch checks, deferred errors):
//  - cuDNN and cuBLAS handles bound to the device's compute stream, one set per (host thread,
//    device), because a handle must not be used by two threads at once. Handles of exited threads
//    are pooled (kernels/cuda/handles.cpp);
//  - the cuDNN and cuBLAS check macros (file:line, the call, the library's own error text);
//  - argument checks and pointer helpers of the kernel entry points.
// The names of core/cuda/context.h are brought into this namespace, so a kernel file writes
// `StreamGuard on(dev); launch(on, kernel, grid, block, 0, args...);`.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <initializer_list>

#include "core/cuda/context.h"
#include "core/error.h"
#include "core/tensor.h"

#define TANDEM_CUDNN_CHECK(expr)                                                                 \
  do {                                                                                           \
    const cudnnStatus_t tandem_cudnn_st_ = (expr);                                               \
    if (tandem_cudnn_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]] {                                 \
      char tandem_cudnn_msg_[512] = {0};                                                         \
      cudnnGetLastErrorString(tandem_cudnn_msg_, sizeof(tandem_cudnn_msg_));                    \
      TANDEM_FAIL(#expr, " failed: ", cudnnGetErrorString(tandem_cudnn_st_),                     \
                  tandem_cudnn_msg_[0] ? " (" : "", tandem_cudnn_msg_, tandem_cudnn_msg_[0] ? ")" : ""); \
    }                                                                                            \
  } while (0)

#define TANDEM_CUBLAS_CHECK(expr)                                                                \
  do {                                                                                           \
    const cublasStatus_t tandem_cublas_st_ = (expr);                                             \
    if (tandem_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                 \
      TANDEM_FAIL(#expr, " failed: ", cublasGetStatusName(tandem_cublas_st_), ": ",              \
                  cublasGetStatusString(tandem_cublas_st_));                                     \
  } while (0)

namespace tandem::kernels::cuda {

using tandem::cuda::capture_replay_counter;
using tandem::cuda::check_device_index;
using tandem::cuda::compute_stream;
using tandem::cuda::DeviceGuard;
using tandem::cuda::grid_for;
using tandem::cuda::kernel_error_record;
using tandem::cuda::KernelErrorRecord;
using tandem::cuda::kClassTargetOutOfRange;
using tandem::cuda::KernelErrorOp;
using tandem::cuda::kIndexOutOfRange;
using tandem::cuda::kNllTargetOutOfRange;
using tandem::cuda::kNoKernelError;
using tandem::cuda::mark_kernel_error_check_pending;
using tandem::cuda::StreamGuard;

// Handles bound to compute_stream(device), owned by the calling thread.
cudnnHandle_t cudnn_handle(int device);
cublasHandle_t cublas_handle(int device);

// True when TANDEM_ALLOW_TF32=1 is set: cuBLAS and cuDNN may then use TF32 tensor cores for
// float32 math (faster, ~1e-3 relative error). Off by default so results match the CPU kernels
// to float32 rounding.
bool allow_tf32();

// Every defined tensor must be float32 on one CUDA device; returns that device's index.
int check_f32_cuda(const char* op, std::initializer_list<Tensor> tensors);

// Every defined tensor must be float32, or every one float64, on one CUDA device; returns that
// device's index (the kernels with a float64 path: kernels/ops.h's family comments name them).
int check_f32_f64_cuda(const char* op, std::initializer_list<Tensor> tensors);

// Element pointer of a CUDA tensor (its storage plus offset); outputs are written through the
// const handle as every Tensor is a handle.
inline float* f32_ptr(const Tensor& t) { return static_cast<float*>(const_cast<void*>(t.raw_data())); }
template <typename T>
T* elem_ptr(const Tensor& t) {
  return static_cast<T*>(const_cast<void*>(t.raw_data()));
}

// fn(float{}) for float32, fn(double{}) for float64 (the dtypes check_f32_f64_cuda admits).
template <typename Fn>
decltype(auto) dispatch_cuda_float(DType dtype, Fn&& fn) {
  if (dtype == kFloat64) return fn(double{});
  return fn(float{});
}

// Throws unless v fits in an int (cuDNN and cuBLAS take int dimensions).
int to_int(int64_t v, const char* op, const char* what);

}  // namespace tandem::kernels::cuda
