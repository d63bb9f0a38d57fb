// batch_norm over the channel dimension of x [N, C, ...] (BatchNorm1d/2d).
// Training: normalise with the batch statistics (biased variance) and, when
// running_mean/running_var are defined, update them in place with momentum
// and the unbiased variance, as PyTorch does. Eval: normalise with the running
// statistics. save_mean/save_invstd [C] are what backward needs: the batch
// mean and 1/sqrt(var + eps) in training, the running ones in eval.
// weight/bias [C] may be undefined (affine=false).
// On the CPU x may be bfloat16 with every other operand float32: the kernels widen it as they read it
// and compute in float32; the output and saved statistics are float32, grad_out float32, and the
// backward's input gradient bfloat16 (rounded to nearest even), the weight and bias gradients
// float32: bitwise what casting x to float32, the float32 kernel and casting the input gradient to
// bfloat16 give.
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

struct BatchNormForward {
  Tensor output, save_mean, save_invstd;
};

struct BatchNormGrads {
  Tensor input, weight, bias;
};

BatchNormForward batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    const Tensor& running_mean, const Tensor& running_var, bool training,
                                    double momentum, double eps);
BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                   const Tensor& save_mean, const Tensor& save_invstd, bool training,
                                   bool need_input, bool need_weight, bool need_bias);

// relu(batch_norm(x)): the forward's output is the relu'd one; the backward takes the forward's
// bias and gives the gradients of relu(batch_norm(x)) without the relu output. One fused kernel on
// the CPU; elsewhere batch_norm's and relu's kernels one after the other (the same values up to
// float32 rounding).
BatchNormForward batch_norm_relu_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         const Tensor& running_mean, const Tensor& running_var, bool training,
                                         double momentum, double eps);
BatchNormGrads batch_norm_relu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                        const Tensor& bias, const Tensor& save_mean, const Tensor& save_invstd,
                                        bool training, bool need_input, bool need_weight, bool need_bias);

}  // namespace tandem::kernels
