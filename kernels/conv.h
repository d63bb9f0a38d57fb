// conv2d forward and backward. x [N, C, H, W], weight [K, C / groups, R, S], bias [K]
// or undefined; output [N, K, P, Q] with P = (H + 2*pad_h - dilation_h*(R-1) - 1) / stride_h + 1.
// Inputs need not be contiguous; outputs are contiguous. dtype f32 (f64 on CPU).
// Dilation and groups other than 1 are taken by the CUDA kernels (cuDNN) only; on the CPU they
// throw, and nn::functional::conv2d composes them from plain convolutions there.
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

struct Conv2dArgs {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1, groups = 1;
};

struct Conv2dGrads {
  Tensor input, weight, bias;  // undefined where not asked for
};

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args);
Conv2dGrads conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                            const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias);

}  // namespace tandem::kernels
