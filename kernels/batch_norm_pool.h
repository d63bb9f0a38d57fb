// Fused max_pool2d(relu(batch_norm(x)), kernel 2, stride 2, no padding, floor mode) over
// x [N, C, H, W] (H, W >= 2), CPU only: batch_norm_relu_pool2d (below) composes batch_norm_relu_forward
// and max_pool2d_forward elsewhere (CUDA, other dtypes); nn composes them for synced statistics.
// Forward: the batch_norm statistics exactly as batch_norm_forward (training: batch mean and
// biased variance, running stats updated in place with momentum and the unbiased variance; eval:
// the running stats), then only pooled-size data is written: the output [N, C, H/2, W/2], bitwise
// equal to max_pool2d(batch_norm_relu(x)), a uint8 code per pooled element saying which window
// position won: 0 (0,0), 1 (0,1), 2 (1,0), 3 (1,1) (the first maximum in that order wins and a NaN
// counts as a maximum, as max_pool2d), and the x value there (winner: the backward's sums need
// only it, so they run over pooled-size data). The full-size activations are never materialised.
// Backward: from the pooled gradient straight to the gradients of x, weight and bias: the pooled
// gradient flows to the winning position only, masked by relu'(v) = (v > 0) of the value v
// recomputed from x with the forward's instructions; every x element (also the last row/column
// that odd H/W drop from pooling) gets the batch_norm input gradient. Equal to the unfused
// composition's gradients up to float32 summation order. Both directions give the same bits on
// repeated calls and for any thread count. A bfloat16 x is taken as batch_norm_forward takes it
// (kernels/batch_norm.h): float32 outputs, a bfloat16 input gradient.
#pragma once

#include "core/tensor.h"
#include "kernels/batch_norm.h"

namespace tandem::kernels {

struct BatchNormReluPoolForward {
  Tensor output;                  // [N, C, H/2, W/2], x's dtype (float32 for a bfloat16 x)
  Tensor code;                    // [N, C, H/2, W/2], uint8 in 0..3: the winning window position
  Tensor winner;                  // [N, C, H/2, W/2], as output: x at the winning position
  Tensor save_mean, save_invstd;  // [C], as BatchNormForward's
};

BatchNormReluPoolForward batch_norm_relu_max_pool2d_forward(const Tensor& x, const Tensor& weight,
                                                            const Tensor& bias, const Tensor& running_mean,
                                                            const Tensor& running_var, bool training,
                                                            double momentum, double eps);
// grad_out [N, C, H/2, W/2]; x, weight, bias, and code, winner, save_mean, save_invstd from the forward.
BatchNormGrads batch_norm_relu_max_pool2d_backward(const Tensor& grad_out, const Tensor& x,
                                                   const Tensor& code, const Tensor& winner,
                                                   const Tensor& weight, const Tensor& bias,
                                                   const Tensor& save_mean, const Tensor& save_invstd,
                                                   bool training, bool need_input, bool need_weight,
                                                   bool need_bias);

// max_pool2d(relu(batch_norm(x)), 2) on any backend and float dtype: the entry point callers use.
// It takes the fused kernel above where it applies (a backend that has it, x float32, or bfloat16 on
// the CPU, [N, C, H, W] with H, W >= 2) and otherwise batch_norm_relu_forward then max_pool2d_forward (kernel 2), whose
// checks and messages then apply. The forward's result says which ran (code and winner, or the
// pooling's indices); the backward takes it and runs the matching backward.
struct BatchNormReluPool {
  Tensor output, save_mean, save_invstd;
  Tensor code, winner;  // the fused kernel's, when it ran
  Tensor indices;       // max_pool2d's, when the ops ran one by one
};
BatchNormReluPool batch_norm_relu_pool2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         const Tensor& running_mean, const Tensor& running_var, bool training,
                                         double momentum, double eps);
BatchNormGrads batch_norm_relu_pool2d_backward(const Tensor& grad_out, const Tensor& x,
                                               const BatchNormReluPool& forward, const Tensor& weight,
                                               const Tensor& bias, bool training, bool need_input, bool need_weight,
                                               bool need_bias);

}  // namespace tandem::kernels
