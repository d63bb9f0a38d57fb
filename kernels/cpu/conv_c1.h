// Internal: direct float32 convolution for one input channel, a 3x3 kernel,
// stride 1 and padding 0 (the first layer of the MNIST net) or 1 (a ResNet's
// stem: the output has the image's size), used by kernels/cpu/conv.cpp instead
// of im2col + GEMM, whose depth of 9 wastes most of a GEMM kernel, or of
// conv3x3.h's kernels, whose bordered copies cost more than one channel's
// arithmetic. AVX-512 only: conv_c1_supported() is false elsewhere.
// Assumes contiguous NCHW float tensors; H >= 3 and W >= 3 without padding.
// Guarantees: each call touches only the images [n0, n1) it is given; the
// summation order depends only on the shapes and [n0, n1), so results are
// deterministic for a fixed chunking.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/conv.h"

namespace tandem::kernels::cpu::detail {

// True when this build has the direct kernels (AVX-512) and the geometry fits: C = 1, 3x3, stride 1,
// padding 0 or 1 (the same both ways).
bool conv_c1_supported(int64_t C, int64_t R, int64_t S, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                       int64_t pad_w);

// y[n] = w * x[n] (+ b) for n in [n0, n1) with padding `pad` (0 or 1); y is [N, K, H-2, W-2] for
// padding 0, [N, K, H, W] for 1; b may be null. Out is float, or uint16_t for bf16 bits (each output
// computed in f32 and rounded to nearest even once, NaN kept).
template <typename Out>
void conv_c1_forward(const float* x, const float* w, const float* b, Out* y, int64_t n0, int64_t n1, int64_t H,
                     int64_t W, int64_t K, int64_t pad);

// dw[K, 9] += sum over n in [n0, n1) of gy[n] (x) x[n]; db[K] += sums of gy[n]
// (either may be null to skip it), gy shaped as conv_c1_forward's y for `pad`. G is float, or
// uint16_t for bf16 bits (widened exactly: the same sums as on the widened gradient).
template <typename G>
void conv_c1_weight_grad(const G* gy, const float* x, float* dw, float* db, int64_t n0, int64_t n1, int64_t H,
                         int64_t W, int64_t K, int64_t pad);

// conv_c1_weight_grad without padding in steps, for a gradient produced image by image
// (kernels/cpu/conv_bn_pool.cpp):
// conv_c1_weight_grad_image adds image gy [K, H-2, W-2] of x [H, W] into part (conv_c1_part_size(K)
// floats, zeroed before the first image), conv_c1_weight_grad_finish adds part's sums into dw, db
// (either may be null). conv_c1_weight_grad over [n0, n1) is exactly these steps, image by image.
int64_t conv_c1_part_size(int64_t K);
template <typename G>
void conv_c1_weight_grad_image(const G* gy, const float* x, float* part, int64_t H, int64_t W, int64_t K);
void conv_c1_weight_grad_finish(const float* part, float* dw, float* db, int64_t K);

}  // namespace tandem::kernels::cpu::detail

namespace tandem::kernels::cpu {
// Autocast's f32 route for a one-channel conv (kernels/amp.h), its bf16 seams fused: the forward of
// f32 x, w, b stores y in bf16 (each output rounded once: the bits of the f32 conv then a cast), and
// the weight and bias gradients (f32) read a bf16 grad_out directly (the bits of widening it first).
// Callers check *_applies first (CPU, the dtypes and shapes these take, conv_c1_supported).
bool conv2d_c1_bf16_applies(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args);
bool conv2d_c1_bf16_backward_applies(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dArgs& args);
Tensor conv2d_c1_forward_bf16(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args);
Conv2dGrads conv2d_c1_backward_bf16(const Tensor& gy, const Tensor& x, const Tensor& w, const Conv2dArgs& args,
                                    bool need_weight, bool need_bias);
}  // namespace tandem::kernels::cpu
