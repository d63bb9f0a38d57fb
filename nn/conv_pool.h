// conv2d with PyTorch's full geometry (per-axis stride and padding, dilation, groups) and average
// pooling, differentiable. Inputs [N, C, H, W] or unbatched [C, H, W].
//   conv2d(x, weight [K, C/groups, R, S], bias [K] or undefined, params): with groups == 1,
//     dilation 1 and square stride/padding this is F::conv2d of nn/functional.h (CPU and CUDA
//     kernels, autocast). Otherwise float32/float64: a dilated kernel is the weight spread over a
//     (R-1)d+1 x (S-1)d+1 grid of zeros (differentiably), groups run as separate convolutions on
//     channel slices whose outputs are concatenated (CPU). On CUDA (float32) it is one cuDNN
//     convolution taking dilation and groups itself (kernels/conv.h).
//   avg_pool2d(x, kernel, stride (default = kernel), padding, ceil_mode, count_include_pad,
//   divisor_override (> 0: every window's sum divided by it, as PyTorch's)) and
//   adaptive_avg_pool2d(x, {out_h, out_w}): kernels/avg_pool.h (CPU and CUDA).
//   max_pool2d_with_indices: F::max_pool2d (nn/functional.h) with PyTorch's return_indices: the
//   int64 flat position h*W + w of each maximum in its input plane (what max_unpool takes).
//   adaptive_max_pool2d(x, {out_h, out_w}): windows as adaptive_avg_pool2d's, the maximum of each
//   (a NaN wins), with or without the indices; kernels/pool.h (CPU and CUDA).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "nn/reduction.h"  // MaxOutput

namespace tandem::nn::functional {

struct Conv2dParams {
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params);

// {conv2d(x, main_weight, no bias, stride 2, padding 1), conv2d(x, projection_weight, no bias, stride 2,
// padding 0)}: a ResNet block's 3x3 [K3, C, 3, 3] and its 1x1 shortcut [K1, C, 1, 1], which read the same
// x. One op with one backward node where kernels::conv2d_pair_applies (CPU, float32 or float64, no
// autocast; kernels/conv_pair.h: the CPU's fused stride-2 kernels where they apply, x's gradient summed
// inside the op); else the two F::conv2d calls.
struct ConvPairOutput {
  Tensor main, projection;
};
ConvPairOutput conv2d_pair(const Tensor& x, const Tensor& main_weight, const Tensor& projection_weight);
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0, bool ceil_mode = false,
                  bool count_include_pad = true, int64_t divisor_override = 0);
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);
MaxOutput max_pool2d_with_indices(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0,
                                  int64_t dilation = 1, bool ceil_mode = false);
Tensor adaptive_max_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);
MaxOutput adaptive_max_pool2d_with_indices(const Tensor& x, std::array<int64_t, 2> output_size);

}  // namespace tandem::nn::functional
