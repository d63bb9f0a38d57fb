// max_pool2d(relu(batch_norm(conv2d(x))), 2): a convolution and the fused batch norm + relu + 2x2 max-pool
// of kernels/batch_norm_pool.h as one op, the first layer of the MNIST net. On the CPU, for a float32 conv
// with one input channel, a 3x3 kernel, stride 1 and no padding (kernels/cpu/conv_c1.h, AVX-512 builds),
// the conv output is never stored: each pass over it (the statistics, the pooling, the backward's input
// gradient) computes the conv images it needs again from x, and the batch norm's input gradient goes
// image by image straight into the conv's weight and bias gradients. The values are bitwise those of the
// ops one by one for the same thread count (conv2d_forward, then batch_norm_relu_max_pool2d_forward;
// batch_norm_relu_max_pool2d_backward, then conv2d_backward's weight and bias gradients). x itself gets
// no gradient. Elsewhere the kernel runs those ops one by one (its backward computing the conv output
// again), and callers compose them instead (conv_batch_norm_relu_pool2d_applies). Entry points:
// kernels/batch_norm.cpp.
#pragma once

#include "core/tensor.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/conv.h"

namespace tandem::kernels {

struct ConvBatchNormReluPoolGrads {
  Tensor conv_weight, conv_bias, weight, bias;  // each undefined unless asked for
};

// The table op (kernels/ops.h, CPU only): x [N, 1, H, W] (H, W >= 4) and conv_weight [K, 1, 3, 3]
// (conv_bias [K] or undefined), stride 1, no padding, float32 or float64; weight, bias, running
// statistics [K] as batch_norm_relu_max_pool2d_forward takes them, whose result it returns.
BatchNormReluPoolForward conv_batch_norm_relu_max_pool2d_forward(const Tensor& x, const Tensor& conv_weight,
                                                                 const Tensor& conv_bias, const Tensor& weight,
                                                                 const Tensor& bias, const Tensor& running_mean,
                                                                 const Tensor& running_var, bool training,
                                                                 double momentum, double eps);
// grad_out [N, K, (H-2)/2, (W-2)/2]; forward: the forward's result (its output is not read).
ConvBatchNormReluPoolGrads conv_batch_norm_relu_max_pool2d_backward(
    const Tensor& grad_out, const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
    const BatchNormReluPoolForward& forward, const Tensor& weight, const Tensor& bias, bool training,
    bool need_conv_weight, bool need_conv_bias, bool need_weight, bool need_bias);

// Whether the fused path takes these operands: a CPU backend with the op and the fused kernels (AVX-512),
// float32, the geometry above. Callers compose the ops elsewhere (the conv output then kept, not
// recomputed).
bool conv_batch_norm_relu_pool2d_applies(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                                         const Conv2dArgs& args);

}  // namespace tandem::kernels
