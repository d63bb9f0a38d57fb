// max_pool2d(relu(batch_norm(conv2d(x))), 2): a convolution and the fused batch norm + relu + 2x2 max-pool
// of kernels/batch_norm_pool.h as one op, the first layer of the MNIST net. On the CPU, for a float32
// conv with one input channel, a 3x3 kernel, stride 1 and no padding (kernels/cpu/conv_c1.h, AVX-512
// builds), the two run interleaved image by image: the forward's statistics read each conv output image
// right after it is written (still in cache), and the backward's input gradient of the batch norm never
// reaches memory: each image of it goes straight into the conv's weight and bias gradients. The values
// are bitwise those of the ops one by one for the same thread count (conv2d_forward, then
// batch_norm_relu_pool2d; batch_norm_relu_pool2d_backward, then conv2d_backward's weight and bias
// gradients). x itself gets no gradient. Elsewhere (other dtypes, geometries, backends) callers run
// those ops one by one (conv_batch_norm_relu_pool2d_applies). Entry points: kernels/batch_norm.cpp.
#pragma once

#include "core/tensor.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/conv.h"

namespace tandem::kernels {

struct ConvBatchNormReluPoolForward {
  Tensor conv_output;             // [N, K, P, Q]: the conv's output, the batch norm's input (kept for the backward)
  BatchNormReluPoolForward pool;  // the fused batch norm's result on it
};
struct ConvBatchNormReluPoolGrads {
  Tensor conv_weight, conv_bias, weight, bias;  // each undefined unless asked for
};

// The table op (kernels/ops.h, CPU only): x [N, 1, H, W] and conv_weight [K, 1, 3, 3] (conv_bias [K] or
// undefined), stride 1, no padding, float32 or float64; weight, bias, running statistics [K] as
// batch_norm_relu_max_pool2d_forward takes them.
ConvBatchNormReluPoolForward conv_batch_norm_relu_max_pool2d_forward(const Tensor& x, const Tensor& conv_weight,
                                                                     const Tensor& conv_bias, const Tensor& weight,
                                                                     const Tensor& bias, const Tensor& running_mean,
                                                                     const Tensor& running_var, bool training,
                                                                     double momentum, double eps);
// grad_out [N, K, P/2, Q/2]; forward: the forward's result.
ConvBatchNormReluPoolGrads conv_batch_norm_relu_max_pool2d_backward(
    const Tensor& grad_out, const Tensor& x, const Tensor& conv_weight, const ConvBatchNormReluPoolForward& forward,
    const Tensor& weight, const Tensor& bias, bool training, bool need_conv_weight, bool need_conv_bias,
    bool need_weight, bool need_bias);

// Whether the table op takes these operands (a CPU backend with it, the geometry and dtype above, a
// float32 or float64 batch norm of K channels whose pooling window fits); callers compose the ops else.
bool conv_batch_norm_relu_pool2d_applies(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                                         const Conv2dArgs& args);

}  // namespace tandem::kernels
