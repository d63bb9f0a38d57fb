// Internal: direct float32 3x3 convolution with stride 1 and padding 1 (the output has the
// input's size: the 3x3 layers of a ResNet), used by kernels/cpu/conv.cpp for the forward, the
// input gradient (the forward with the weights transposed and flipped) and the weight gradient,
// instead of im2col + GEMM: with
// 8-64 channels the column matrix (9x the image) costs more to write and read than the
// arithmetic. AVX-512 only: conv3x3_supported() is false elsewhere.
// Assumes contiguous NCHW float tensors.
// Guarantees: each call touches only the images [n0, n1) it is given; every output element is
// its bias (or 0) plus the products summed over input channels, then kernel rows, then kernel
// columns, in increasing order: results do not depend on the chunking or the thread count.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu::detail {

// True when this build has the direct kernels (AVX-512) and the geometry is theirs: 3x3, stride
// 1, padding 1, at most kConv3x3MaxChannels input and output channels (wider layers make GEMMs
// that run near the peak anyway, and the weight gradient's per-lane partials grow as C x K).
constexpr int64_t kConv3x3MaxChannels = 64;
bool conv3x3_supported(int64_t C, int64_t K, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w,
                       int64_t pad_h, int64_t pad_w);

// y[n] = w * x[n] (+ b) for n in [n0, n1): x [N, C, H, W], w [K, C, 3, 3], y [N, K, H, W]; b may be null.
void conv3x3_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1, int64_t C,
                     int64_t H, int64_t W, int64_t K);

// gx[n] = the gradient of that convolution's input for gy[n], n in [n0, n1): gy [N, K, H, W],
// gx [N, C, H, W] (overwritten).
void conv3x3_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1, int64_t C, int64_t H,
                        int64_t W, int64_t K);

// dw [K, C, 3, 3] += the weight gradient of that convolution summed over images [n0, n1), for
// gy [N, K, H, W] and x [N, C, H, W]. Per lane partial sums over the images, then one horizontal
// sum: deterministic for a given [n0, n1).
void conv3x3_weight_grad(const float* gy, const float* x, float* dw, int64_t n0, int64_t n1, int64_t C, int64_t H,
                         int64_t W, int64_t K);

}  // namespace tandem::kernels::cpu::detail
