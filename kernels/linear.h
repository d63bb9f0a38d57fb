// linear: y = x * weight^T + bias, x [N, in], weight [out, in], bias [out] or
// undefined. matmul: plain 2-D product a [M, K] * b [K, N].
#pragma once

#include <string>

#include "core/tensor.h"

namespace tandem::kernels {

struct LinearGrads {
  Tensor input, weight, bias;
};

Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias);
LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, bool need_input,
                            bool need_weight, bool need_bias);
Tensor matmul(const Tensor& a, const Tensor& b);

// Runs a short f32 GEMM (512^3, a few repetitions, best kept) on `threads` threads of the kernel
// pool (restoring its size after) and returns GFLOP/s: the peak the profiler's report compares
// each op with. Not recorded by the profiler (it calls the CPU kernel below the dispatcher).
double measure_gemm_peak_gflops(int threads);
// The same 512^3 GEMM on bf16 operands through the CPU's native low-precision path (oneDNN: AMX or
// AVX512_BF16), the peak the report compares the lowp_* ops with; 0 where this CPU has no such path (its
// low-precision ops widen to the f32 kernels).
double measure_lowp_gemm_peak_gflops(int threads);
// profiler::report against this machine's peaks on `threads` threads: the f32 GEMM's, and the bf16 one's
// when low-precision ops were recorded; no % of peak for a GPU's ops.
std::string profile_report(Device device, int threads);

}  // namespace tandem::kernels
