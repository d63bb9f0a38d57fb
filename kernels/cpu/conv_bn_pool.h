// Internal: the two hooks of the CPU's fused batch norm + relu + 2x2 max-pool (kernels/cpu/batch_norm_pool.cpp)
// that the fused conv + batch norm (kernels/cpu/conv_bn_pool.cpp) runs it with; float32 x only.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/batch_norm_pool.h"

namespace tandem::kernels::cpu::detail {

// Takes the input gradient of image n, [C, H, W], computed on chunk `chunk` of for_each_chunk.
using ImageGradSink = std::function<void(int64_t chunk, int64_t n, const float* gx)>;

// batch_norm_relu_max_pool2d_forward with BnForwardArgs::before_image: in training, before_image(n) is
// called before the statistics read image n of x (n >= 1; image 0 must be in x before the call).
BatchNormReluPoolForward bn_relu_pool_forward_producing(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                        const Tensor& running_mean, const Tensor& running_var,
                                                        bool training, double momentum, double eps,
                                                        const std::function<void(int64_t)>& before_image);

// batch_norm_relu_max_pool2d_backward whose input gradient goes image by image to sink over
// for_each_chunk(N, chunks) instead of into a tensor (the result's input stays undefined).
BatchNormGrads bn_relu_pool_backward_to_sink(const Tensor& grad_out, const Tensor& x, const Tensor& code,
                                             const Tensor& winner, const Tensor& weight, const Tensor& bias,
                                             const Tensor& save_mean, const Tensor& save_invstd, bool training,
                                             bool need_weight, bool need_bias, int64_t chunks,
                                             const ImageGradSink& sink);

}  // namespace tandem::kernels::cpu::detail
