// The CPU kernels' oneDNN layer (kernels/cpu/dnnl.cpp); internal, not part of the public API, and
// free of oneDNN's headers (only dnnl.cpp includes dnnl.hpp, so oneDNN stays a private dependency).
// Owns: the one CPU engine, the bounded cache of primitives keyed by kind, shapes, strides and
// dtypes, the threading (oneDNN single-threaded on each of the engine pool's threads, the pool
// splitting each call: kernels/cpu/dnnl.cpp), which
// ISA oneDNN dispatches to, and the record of which GEMM path each linear/conv call took
// (gemm_path_count).
// Assumes: host tensors; callers validated shapes (kernels/{linear,conv,amp}.cpp).
// Guarantees: every entry point returns false (and does nothing) when the build has no oneDNN
// (TANDEM_ONEDNN=OFF) or oneDNN has no implementation for the case, so the caller runs its Eigen
// path. Bits: a oneDNN result depends on the shapes, dtypes, the thread count and the ISA oneDNN
// dispatches to (CPUID, capped by ONEDNN_MAX_CPU_ISA); never on run-to-run timing (each call runs
// as one slice per thread, each single-threaded, reduced in slice order).
#pragma once

#include <cstdint>
#include <functional>

#include "core/tensor.h"
#include "kernels/conv.h"
#include "kernels/linear.h"

namespace tandem::kernels::cpu {

// The kernels whose GEMM path is recorded.
enum class GemmKernel : int {
  linear_forward,   // linear_forward (f32)
  linear_backward,  // linear_backward (f32)
  lowp_linear,      // lowp_linear_forward / lowp_linear_backward (bf16, f16)
  lowp_conv2d,      // lowp_conv2d_forward / lowp_conv2d_backward (bf16, f16)
  conv2d_forward,   // conv2d_forward (f32): onednn_f32 or eigen (the engine's im2col/direct kernels)
  conv2d_backward,  // conv2d_backward (f32), likewise
};
inline constexpr int kGemmKernels = 6;

// The paths: Eigen GEMM, the AVX-512 small GEMM (kernels/cpu/small_gemm.h), oneDNN in f32, oneDNN
// in bf16 on AVX512_BF16 (vdpbf16ps) or on AMX tiles, and the fallback of the low-precision kernels
// (operands widened to f32, the f32 kernels, results rounded) where the CPU has neither.
enum class GemmPath : int { eigen, small_gemm, onednn_f32, onednn_bf16_avx512, onednn_amx, fallback };
inline constexpr int kGemmPaths = 6;

const char* gemm_path_name(GemmPath path);

// How many calls of `kernel` took `path` in this process so far.
uint64_t gemm_path_count(GemmKernel kernel, GemmPath path);

// Whether the build has oneDNN (TANDEM_ONEDNN).
bool onednn_built();

// The ISA oneDNN dispatches to on this CPU (CPUID, capped by ONEDNN_MAX_CPU_ISA): "avx512_core_amx",
// "avx512_core_bf16", "avx512_core", "avx2", ... ; "none" without oneDNN.
const char* onednn_isa();

// The path a bf16 (or f16) GEMM takes here: onednn_amx, onednn_bf16_avx512, or fallback (no oneDNN,
// no native bf16 instructions, or f16, which this CPU path widens).
GemmPath lowp_gemm_path(DType dtype);

// How detail::onednn_matmul cuts a call over the engine's pool. oneDNN's native bf16 matmul
// (brg:avx512_core_bf16, 2.6) takes dense operands only: an operand with a leading dimension
// larger than its extent (a column slice of a row-major matrix, a row slice of a transposed one)
// gets oneDNN's generic gemm:jit, which counts as no native kernel, so the whole bf16 linear fell
// back to widened f32 math. The rules, in order (slices of >= 2^20 multiply-adds, one per thread
// at most, so every split is whole at 1 thread):
//   rows:  a row-major dense and M >= N (or no column split possible): row slices of a and c.
//   cols:  b column-major dense (a linear's w^T): column slices of b, each into a dense buffer,
//          copied into c's columns.
//   depth: a column-major dense (gy^T), b row-major dense (x), no bias (a linear's weight
//          gradient): slices of the depth K of >= 128 each, one f32 partial each, summed in slice
//          order and rounded once.
//   whole: one call on the calling thread.
// And, at exactly 2 threads, a linear's input and weight gradients (the same n * o * i
// multiply-adds each) run side by side, each whole on one of the two threads (paired; see
// pair_linear_gradients): one hand-off to the pool instead of two, no partial sums, and
// primitives of the full shapes.
enum class MatmulSplit : int { whole, rows, cols, depth, paired };
inline constexpr int kMatmulSplits = 5;

// How many onednn_matmul calls took `split` in this process so far.
uint64_t matmul_split_count(MatmulSplit split);

namespace detail {

void count_gemm_path(GemmKernel kernel, GemmPath path);

// A 2-D operand: element (i, j) at data + i * row_stride + j * col_stride (in elements).
struct MatView {
  const void* data;
  DType dtype;
  int64_t rows, cols, row_stride, col_stride;
};

// c [M, N] (contiguous, its own dtype) = a [M, K] * b [K, N] (+ bias [N], f32 or c's dtype),
// f32 accumulation, cut over the pool as MatmulSplit says (whole on the calling thread when
// `paired`: the caller runs it beside another, see run_pair). Returns false when oneDNN cannot run
// it (c may then hold the slices that did run: the caller discards it).
bool onednn_matmul(const MatView& a, const MatView& b, const Tensor& bias, Tensor& c, bool paired = false);

// Whether the input and weight gradients of a linear of `work` (n * o * i) multiply-adds run as a
// pair: the pool has exactly 2 threads and each product has at least 2^20 multiply-adds (below
// that one thread runs both: the hand-off costs more than it saves).
bool pair_linear_gradients(int64_t work);

// Runs first() and second() at once on the pool's first two threads; true when both returned true
// (a oneDNN error counts as false).
bool run_pair(const std::function<bool()>& first, const std::function<bool()>& second);

// Convolutions on NCHW tensors in and out (any of f32/bf16 each, contiguous), computed in
// `compute` (f32 or bf16) with f32 accumulation, in oneDNN's own blocked layouts (the tensors are
// copied, and cast, into them and out as part of the call: kernels/cpu/block_layout.h's transposes
// for NCHW <-> nChw16c, oneDNN's reorders otherwise). Return false, touching nothing,
// when oneDNN cannot run the case.
bool onednn_conv_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args, DType compute,
                         Tensor& y);
bool onednn_conv_backward_data(const Tensor& gy, const Tensor& w, const Conv2dArgs& args, DType compute,
                               Tensor& gx);
// gw (and gb when defined: [K]) from x and gy.
bool onednn_conv_backward_weights(const Tensor& gy, const Tensor& x, const Conv2dArgs& args, DType compute,
                                  Tensor& gw, Tensor* gb);

}  // namespace detail

// Float32 conv2d on oneDNN (kernels/cpu/lowp.cpp) where it beats the engine's own kernels: at
// least 16 input and 16 output channels (ResNet's stages; bench/PERF_NOTES.md section 14). False
// (nothing done) elsewhere or when oneDNN cannot run the case.
bool f32_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args, Tensor& y);
bool f32_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dArgs& args,
                         bool need_input, bool need_weight, bool need_bias, Conv2dGrads& grads);
// Whether those two take a float32 conv of x and w (oneDNN built, the sizes above; kernels/cpu/conv_pair.cpp
// asks it of a pair's 3x3).
bool f32_conv_pays(const Tensor& x, const Tensor& w, const Conv2dArgs& a);
}  // namespace tandem::kernels::cpu

// ---- low-precision (bf16) linear and conv2d on oneDNN (kernels/cpu/lowp.cpp) ----
// Called by kernels/amp.cpp's CPU branch with validated operands of one low-precision dtype d.
// They take the d operands as they are (no widening pass), accumulate in f32 and write d results
// (the cast to d fused into the primitive's output); the bias gradient is a f32 column sum rounded
// once. Each returns false where lowp_*_native(x) is false (counting nothing: the caller counts
// that fallback) or oneDNN has no implementation for the case (counted as a fallback); the caller
// then widens the operands to f32, runs the f32 kernels and rounds the results. Except that
// lowp_conv2d_backward widens only the part (input or weight gradient) oneDNN has no native
// kernel for, and returns true (counting a fallback).
namespace tandem::kernels::cpu {
// Whether the low-precision linear of input x / conv2d computing in d runs natively:
// lowp_gemm_path(dtype) is not fallback, and for conv2d the input has more than one channel (one
// channel: the f32 one-channel kernel, kernels/cpu/conv_c1.h, on widened operands is faster than
// oneDNN's bf16). A conv's x may be float32 (rounded to d while copied into oneDNN's layout; its
// gradient computed in d and widened while copied out).
bool lowp_linear_native(const Tensor& x);
bool lowp_conv2d_native(const Tensor& x, DType d);
bool lowp_linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y);
bool lowp_linear_backward(const Tensor& gy, const Tensor& x, const Tensor& w, bool need_input, bool need_weight,
                          bool need_bias, LinearGrads& grads);
bool lowp_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args, Tensor& y);
bool lowp_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dArgs& args,
                          bool need_input, bool need_weight, bool need_bias, Conv2dGrads& grads);

// Float32 conv2d on oneDNN (kernels/cpu/lowp.cpp) where it beats the engine's own kernels: at
// least 16 input and 16 output channels (ResNet's stages; bench/PERF_NOTES.md section 14). False
// (nothing done) elsewhere or when oneDNN cannot run the case.
bool f32_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args, Tensor& y);
bool f32_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dArgs& args,
                         bool need_input, bool need_weight, bool need_bias, Conv2dGrads& grads);
}  // namespace tandem::kernels::cpu
