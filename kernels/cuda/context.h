// Internal to the CUDA backend (core/cuda, kernels/cuda, dist's NCCL code); never included by a
// public header. Owns the per-device CUDA state every GPU kernel runs against:
//  - one compute stream per device, created lazily (non-blocking: it does not synchronise with
//    the legacy default stream). ALL compute work of the backend is queued on it, so work is
//    ordered by the stream alone; nothing here calls cudaDeviceSynchronize. Code that uses another
//    stream (the NCCL communication stream) orders itself against this one with events;
//  - cuDNN and cuBLAS handles bound to that stream, one set per (host thread, device), because a
//    handle must not be used by two threads at once. Handles of exited threads are pooled;
//  - the check macros: every CUDA, cuDNN and cuBLAS call goes through one, and a failure throws
//    tandem::Error carrying file:line, the failing expression and the library's own error text;
//  - a small device-side error record for kernels that find bad input (an out-of-range nll_loss
//    target) without a host synchronisation: it is read, and thrown as tandem::Error, the next
//    time the host waits for the compute stream (any device-to-host copy, e.g. loss.item()).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <initializer_list>

#include "core/error.h"
#include "core/tensor.h"

// Checks a cudaError_t-returning call. Clears the runtime's last-error slot before throwing so a
// stale error is never reported again by a later launch check.
#define TANDEM_CUDA_CHECK(expr)                                                                  \
  do {                                                                                           \
    const cudaError_t tandem_cuda_err_ = (expr);                                                 \
    if (tandem_cuda_err_ != cudaSuccess) [[unlikely]] {                                          \
      (void)cudaGetLastError();                                                                  \
      TANDEM_FAIL(#expr, " failed: ", cudaGetErrorName(tandem_cuda_err_), ": ",                  \
                  cudaGetErrorString(tandem_cuda_err_));                                         \
    }                                                                                            \
  } while (0)

// Checks the launch of the kernel just queued (bad configuration, no kernel image for this GPU).
#define TANDEM_CUDA_CHECK_LAUNCH() TANDEM_CUDA_CHECK(cudaGetLastError())

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

// Throws unless 0 <= device < cuda_device_count(), naming the device and the count.
void check_device_index(int device);

// Makes `device` current for the scope and restores the previous current device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The compute stream of a device (created on first use, lives for the process).
cudaStream_t compute_stream(int device);

// Handles bound to compute_stream(device), owned by the calling thread.
cudnnHandle_t cudnn_handle(int device);
cublasHandle_t cublas_handle(int device);

// True when TANDEM_ALLOW_TF32=1 is set: cuBLAS and cuDNN may then use TF32 tensor cores for
// float32 math (faster, ~1e-3 relative error). Off by default so results match the CPU kernels
// to float32 rounding.
bool allow_tf32();

// ---- deferred kernel errors ----

enum KernelErrorCode : int { kNoKernelError = 0, kNllTargetOutOfRange = 1 };

// Written by a kernel that detects bad input: the first writer claims `code` with atomicCAS and
// fills a, b, c (for kNllTargetOutOfRange: row, target value, number of classes).
struct KernelErrorRecord {
  int code;
  int pad_;
  long long a, b, c;
};

// The device's record (device memory, zeroed on creation). Call mark_kernel_error_check_pending
// after queueing a kernel that may write it.
KernelErrorRecord* kernel_error_record(int device);
void mark_kernel_error_check_pending(int device);
// If a kernel that may report was queued since the last check: reads the record after the
// compute stream's queued work (this waits for the stream), clears it, and throws tandem::Error
// describing the first error found. Called by every device-to-host copy after its own wait.
void check_kernel_errors(int device);

// ---- helpers shared by the kernels ----

// Every defined tensor must be float32 on one CUDA device; returns that device's index.
int check_f32_cuda(const char* op, std::initializer_list<Tensor> tensors);

// Element pointer of a CUDA tensor (its storage plus offset); outputs are written through the
// const handle as every Tensor is a handle.
inline float* f32_ptr(const Tensor& t) { return static_cast<float*>(const_cast<void*>(t.raw_data())); }

// Grid for a grid-stride loop over n elements (n > 0) with `block` threads per block.
inline unsigned grid_for(int64_t n, int block = 256) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

// Throws unless v fits in an int (cuDNN and cuBLAS take int dimensions).
int to_int(int64_t v, const char* op, const char* what);

// Shared launchers (defined in kernels/cuda/conv.cu) for the per-channel bias of conv and linear.
// y viewed as [N, C, S] contiguous: y[n, c, s] += bias[c].
void add_channel_bias(float* y, const float* bias, int64_t N, int64_t C, int64_t S, cudaStream_t stream);
// out[c] = sum over n, s of dy[n, c, s].
void channel_sum(const float* dy, float* out, int64_t N, int64_t C, int64_t S, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
