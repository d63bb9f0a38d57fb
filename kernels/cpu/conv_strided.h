// Internal: direct float32 convolutions with stride 2 (ResNet's downsampling layers: 3x3 with
// padding 1 and the 1x1 projections), used by kernels/cpu/conv.cpp for the forward, the input
// gradient and the weight gradient instead of im2col + GEMM, whose strided column copies and
// small GEMMs ran at 15-25% of the core's peak on these layers (bench/PERF_NOTES.md section 18).
//
// The zero-padded input is split into its stride x stride phases (phase (a, b) holds the padded
// pixels (i * 2 + a, j * 2 + b)), each a plane of one row pitch; a tap (r, s) then reads phase
// (r % 2, s % 2) at a fixed flat offset from the output position, so the inner loops are those
// of the stride-1 kernels (kernels/cpu/conv3x3.h): contiguous vector loads and broadcast weights.
// The input gradient is computed per phase of the input (the taps of that phase, read from the
// zero-bordered output gradient) and the phases are interleaved back into the image rows.
// AVX-512 only: conv_strided_supported() is false elsewhere.
// Assumes contiguous NCHW float tensors.
// Guarantees: each call touches only the images [n0, n1) it is given; every output element is
// its bias (or 0) plus its products summed in a fixed order (input channels, then taps), so the
// results do not depend on the chunking or the thread count.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu::detail {

// The geometry these kernels take (validated shapes: the output is at least 1x1).
struct StridedConvShape {
  int64_t C, H, W, K, R, S, pad_h, pad_w, P, Q;  // stride 2 both ways; P x Q the output
};

// True when this build has the kernels (AVX-512) and the geometry is theirs: stride 2 both ways,
// 1x1 or 3x3 kernels, padding smaller than the kernel, at most kConv3x3MaxChannels (64) input and
// output channels.
bool conv_strided_supported(int64_t C, int64_t K, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w,
                            int64_t pad_h, int64_t pad_w);

// A 1x1 stride-2 projection these kernels take: the one shape where they beat oneDNN at any width
// (its f32 path and autocast's bf16 conv both leave it to them; bench/PERF_NOTES.md section 18).
inline bool conv_strided_projection(int64_t C, int64_t K, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w,
                                    int64_t pad_h, int64_t pad_w) {
  return R == 1 && S == 1 && conv_strided_supported(C, K, R, S, stride_h, stride_w, pad_h, pad_w);
}

// y[n] = w * x[n] (+ b) for n in [n0, n1): x [N, C, H, W], w [K, C, R, S], y [N, K, P, Q]; b may be null.
void conv_strided_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1,
                          const StridedConvShape& g);

// gx[n] = the input gradient for gy[n], n in [n0, n1): gy [N, K, P, Q], gx [N, C, H, W] (overwritten).
void conv_strided_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1,
                             const StridedConvShape& g);

// dw [K, C, R, S] += the weight gradient summed over images [n0, n1): per lane partial sums over
// the images, then one horizontal sum (deterministic for a given [n0, n1)).
void conv_strided_weight_grad(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1,
                              const StridedConvShape& g);

// gx += the input gradient of a 1x1 stride-2 projection without padding (g): its values added to the even
// pixels of the even rows in place, nothing else touched (the pair's input gradient where oneDNN took the
// 3x3's). conv_strided_projection(...) must hold.
void conv_strided_projection_input_grad_add(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1,
                                            const StridedConvShape& g);

// A 3x3 stride-2 padding-1 convolution (shape g) and a 1x1 stride-2 projection of the same input to K1
// channels (w1 [K1][C], y1 and gy1 [N][K1][P][Q]; a ResNet block's first conv and its shortcut) in one
// pass: the projection reads the conv's phase plane of the even pixels, its input gradient is one more
// input of that plane's phase (so gx holds the sum of both input gradients), and its weight gradient reads
// the conv's planes. No biases. True for the shapes these take (conv_strided_pair_supported).
bool conv_strided_pair_supported(const StridedConvShape& g, int64_t K1);
void conv_strided_pair_forward(const float* x, const float* w3, const float* w1, float* y3, float* y1, int64_t n0,
                               int64_t n1, const StridedConvShape& g, int64_t K1);
void conv_strided_pair_input_grad(const float* gy3, const float* gy1, const float* w3, const float* w1, float* gx,
                                  int64_t n0, int64_t n1, const StridedConvShape& g, int64_t K1);
// dw3 and dw1 accumulated into (callers zero them).
void conv_strided_pair_weight_grad(const float* gy3, const float* gy1, const float* x, float* dw3, float* dw1,
                                   int64_t n0, int64_t n1, const StridedConvShape& g, int64_t K1);

}  // namespace tandem::kernels::cpu::detail
