// Mixed-precision CUDA kernels: the GradScaler's fused unscale + non-finite check (one pass, no
// host wait: the flag stays on the device until the scaler reads it once per step), and the
// per-channel bias add / bias gradient for f16 and bf16 storage used by conv.cu and linear.cu.
// All work is on the device's compute stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/ops.h"
#include "kernels/cuda/amp.cuh"
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"

namespace tandem::kernels::cuda {
namespace {

__global__ void unscale_and_check_kernel(float* g, float* found_inf, float inv_scale, int64_t n) {
  bool bad = false;
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const float v = g[i];
    bad |= !isfinite(v);
    g[i] = v * inv_scale;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;  // benign race: all write 1
}

// The math type of storage type T: float for f32, f16 and bf16, double for f64.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <typename T>
__device__ __forceinline__ acc_t<T> to_f(T v) {
  return static_cast<acc_t<T>>(v);
}
template <typename T>
__device__ __forceinline__ T from_f(acc_t<T> v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ double from_f<double>(double v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void add_channel_bias_t(T* y, const T* bias, int64_t C, int64_t S, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { y[i] = from_f<T>(to_f(y[i]) + to_f(bias[(i / S) % C])); }
}

template <typename T>
__global__ void channel_sum_t(const T* dy, T* out, int64_t N, int64_t C, int64_t S) {
  const int64_t c = blockIdx.x;
  const int64_t m = N * S;
  double acc = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const int64_t n = i / S, s = i - n * S;
    acc += to_f(dy[(n * C + c) * S + s]);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[c] = from_f<T>(static_cast<acc_t<T>>(acc));
}

}  // namespace

int check_float_cuda(const char* op, std::initializer_list<Tensor> tensors, DType& dtype) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    TANDEM_CHECK(t.device().is_cuda(), op, ": expected a CUDA tensor, got ", t.str());
    if (!first) {
      first = &t;
      TANDEM_CHECK(t.dtype() == kFloat32 || t.dtype() == kFloat64 || is_low_precision(t.dtype()), op,
                   ": the CUDA kernels support float32, float64, float16 and bfloat16, got ", t.str());
      continue;
    }
    TANDEM_CHECK(t.device() == first->device() && t.dtype() == first->dtype(), op, ": expected all tensors as ",
                 first->str(), ", got ", t.str());
  }
  TANDEM_CHECK(first != nullptr, op, ": no tensor given");
  check_device_index(first->device().index);
  dtype = first->dtype();
  return first->device().index;
}

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    default: TANDEM_FAIL("cudnn_dtype: no cuDNN type for ", dtype_name(t));
  }
}

cudaDataType cuda_dtype(DType t) {
  switch (t) {
    case DType::Float32: return CUDA_R_32F;
    case DType::Float16: return CUDA_R_16F;
    case DType::BFloat16: return CUDA_R_16BF;
    default: TANDEM_FAIL("cuda_dtype: no CUDA type for ", dtype_name(t));
  }
}

void add_channel_bias_any(const StreamGuard& on, void* y, const void* bias, DType t, int64_t N, int64_t C,
                          int64_t S) {
  const int64_t n = N * C * S;
  if (n == 0) return;
  switch (t) {
    case DType::Float32:
      launch(on, add_channel_bias_t<float>, grid_for(n), 256, 0, static_cast<float*>(y), static_cast<const float*>(bias), C, S, n);
      break;
    case DType::Float64:
      launch(on, add_channel_bias_t<double>, grid_for(n), 256, 0, static_cast<double*>(y), static_cast<const double*>(bias), C, S, n);
      break;
    case DType::Float16:
      launch(on, add_channel_bias_t<__half>, grid_for(n), 256, 0, static_cast<__half*>(y), static_cast<const __half*>(bias), C, S, n);
      break;
    case DType::BFloat16:
      launch(on, add_channel_bias_t<__nv_bfloat16>, grid_for(n), 256, 0, static_cast<__nv_bfloat16*>(y), static_cast<const __nv_bfloat16*>(bias), C, S, n);
      break;
    default: TANDEM_FAIL("add_channel_bias_any: unsupported dtype ", dtype_name(t));
  }
}

void channel_sum_any(const StreamGuard& on, const void* dy, void* out, DType t, int64_t N, int64_t C, int64_t S) {
  if (C == 0) return;
  TANDEM_CHECK(C <= 0x7fffffff, "channel_sum_any: ", C, " channels exceed the grid limit");
  const unsigned grid = static_cast<unsigned>(C);
  switch (t) {
    case DType::Float32:
      launch(on, channel_sum_t<float>, grid, 256, 0, static_cast<const float*>(dy), static_cast<float*>(out), N, C, S);
      break;
    case DType::Float64:
      launch(on, channel_sum_t<double>, grid, 256, 0, static_cast<const double*>(dy), static_cast<double*>(out), N, C, S);
      break;
    case DType::Float16:
      launch(on, channel_sum_t<__half>, grid, 256, 0, static_cast<const __half*>(dy), static_cast<__half*>(out), N, C, S);
      break;
    case DType::BFloat16:
      launch(on, channel_sum_t<__nv_bfloat16>, grid, 256, 0, static_cast<const __nv_bfloat16*>(dy), static_cast<__nv_bfloat16*>(out), N, C, S);
      break;
    default: TANDEM_FAIL("channel_sum_any: unsupported dtype ", dtype_name(t));
  }
}

// One conversion kernel on the compute stream (Tensor::to).
Tensor cast(const Tensor& x, DType to) { return x.to(to); }

void unscale_and_check_(const Tensor& grad, const Tensor& found_inf, double inv_scale) {
  const char* op = "unscale_and_check_";
  const int dev = check_f32_cuda(op, {grad, found_inf});
  TANDEM_CHECK(grad.is_contiguous(), op, ": expected a contiguous float32 gradient, got ", grad.str());
  TANDEM_CHECK(found_inf.numel() == 1, op, ": found_inf must be a 1-element float32 tensor, got ",
               found_inf.str());
  const int64_t n = grad.numel();
  if (n == 0) return;
  StreamGuard on(dev);
  launch(on, unscale_and_check_kernel, grid_for(n), 256, 0, f32_ptr(grad), f32_ptr(found_inf), static_cast<float>(inv_scale), n);
}

}  // namespace tandem::kernels::cuda
