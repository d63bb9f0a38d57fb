// Internal to kernels/cuda (not installed): the low-precision pieces shared by conv.cu and
// linear.cu, defined in kernels/cuda/amp.cu. Storage types are __half (kFloat16) and
// __nv_bfloat16 (kBFloat16); math is float. All launches go on the given guard's device and compute stream.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>
#include <library_types.h>

#include <cstdint>
#include <initializer_list>

#include "core/cuda/context.h"
#include "core/tensor.h"

namespace tandem::kernels::cuda {

// Every defined tensor must be on one CUDA device and share one dtype among f32, f16, bf16 and f64;
// returns the device index and stores the dtype.
int check_float_cuda(const char* op, std::initializer_list<Tensor> tensors, DType& dtype);

cudnnDataType_t cudnn_dtype(DType t);  // f32, f16, bf16, f64
cudaDataType cuda_dtype(DType t);      // f32, f16, bf16

// y viewed as [N, C, S] contiguous, of dtype t: y[n, c, s] += bias[c] (added in float, or in
// double for f64, rounded once).
void add_channel_bias_any(const tandem::cuda::StreamGuard& on, void* y, const void* bias, DType t, int64_t N,
                          int64_t C, int64_t S);
// out[c] = sum over n, s of dy[n, c, s], accumulated in double, written as dtype t.
void channel_sum_any(const tandem::cuda::StreamGuard& on, const void* dy, void* out, DType t, int64_t N, int64_t C,
                     int64_t S);

}  // namespace tandem::kernels::cuda
