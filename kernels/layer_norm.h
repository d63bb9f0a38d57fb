// layer_norm over the trailing `norm_size` elements of x, viewed as [rows, norm_size]: per row,
// mean and biased variance (in double), rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * w + b
// with w, b of norm_size elements or undefined. float32 and float64 on CPU and on CUDA
// (kernels/cuda/layer_norm.cu). The backward works from the saved per-row mean and rstd:
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * w,
//   dw = sum over rows of dy * xhat, db = sum over rows of dy.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::kernels {

struct LayerNormForward {
  Tensor output, mean, rstd;  // mean, rstd: [rows], the input's dtype
};
struct LayerNormGrads {
  Tensor input, weight, bias;  // undefined where not asked for
};

LayerNormForward layer_norm_forward(const Tensor& x, int64_t norm_size, const Tensor& weight, const Tensor& bias,
                                    double eps);
LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool need_input, bool need_weight, bool need_bias);

}  // namespace tandem::kernels
