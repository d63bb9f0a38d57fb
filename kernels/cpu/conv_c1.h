// Internal: direct float32 convolution for one input channel, a 3x3 kernel,
// stride 1 and no padding (the first layer of the MNIST net), used by
// kernels/cpu/conv.cpp instead of im2col + GEMM, whose depth of 9 wastes most
// of a GEMM kernel. AVX-512 only: conv_c1_supported() is false elsewhere.
// Assumes contiguous NCHW float tensors, H >= 3, W >= 3.
// Guarantees: each call touches only the images [n0, n1) it is given; the
// summation order depends only on the shapes and [n0, n1), so results are
// deterministic for a fixed chunking.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu::detail {

// True when this build has the direct kernels (AVX-512) and the geometry fits.
bool conv_c1_supported(int64_t C, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                       int64_t pad_w);

// y[n] = w * x[n] (+ b) for n in [n0, n1); y is [N, K, H-2, W-2]; b may be null.
void conv_c1_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1, int64_t H,
                     int64_t W, int64_t K);

// dw[K, 9] += sum over n in [n0, n1) of gy[n] (x) x[n]; db[K] += sums of gy[n]
// (either may be null to skip it).
void conv_c1_weight_grad(const float* gy, const float* x, float* dw, float* db, int64_t n0, int64_t n1,
                         int64_t H, int64_t W, int64_t K);

}  // namespace tandem::kernels::cpu::detail
