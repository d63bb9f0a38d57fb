// Differentiable ops: each runs its kernel (kernels/*.h) and, when grad mode
// is on and an input requires grad, records a Node whose backward calls the
// matching backward kernel for exactly the inputs that need a gradient.
// Nodes save detached tensors (data, no history), so no reference cycles.
// Mixed precision (nn/amp.h): under an AutocastGuard, conv2d and linear cast f32 input, weight and
// bias to the autocast dtype (differentiably: f32 leaves get f32 gradients) and return f16/bf16
// outputs; explicit f16/bf16 inputs take the same path, and so does a f32 input with a f16/bf16
// weight (parameters in low precision: FSDP's mixed precision). The batch norms (batch_norm, batch_norm_relu,
// batch_norm_relu_max_pool2d) take a CPU bf16 input as it is when their other operands are f32: the
// kernels read it in bf16, compute and return f32, and give its gradient in bf16 (the bits of casting
// it up and the gradient down). relu, max_pool2d, log_softmax, nll_loss and the batch norms' other
// f16/bf16 inputs (CUDA, f16) cast up to f32 at entry and compute in f32, as do the general ops
// that have no half kernels (binary and unary ops, layer_norm and its parameters, embedding's table;
// F::float32_if_half).
// The general op set (broadcasting elementwise ops, reductions, views, matmul, softmax, losses,
// dropout, layer_norm, embedding, scaled_dot_product_attention) is declared in the headers included
// below, in the same namespace.
#pragma once

#include "core/tensor.h"
#include "nn/attention.h"
#include "nn/composite.h"
#include "nn/conv_pool.h"
#include "nn/losses.h"
#include "nn/pointwise.h"
#include "nn/reduction.h"
#include "nn/shape_ops.h"
#include "nn/sorting.h"

namespace tandem::nn::functional {

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride = 1,
              int64_t padding = 0);
// running_mean/running_var may be undefined (then training uses batch
// statistics only and eval is an error); weight/bias may be undefined.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);
// relu(batch_norm(...)) through kernels::batch_norm_relu_forward, whose entry point takes the CPU's
// fused kernel (two passes fewer over the activations each way) and composes batch_norm and relu
// elsewhere. Same arguments as batch_norm.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                       double eps = 1e-5);
// max_pool2d(relu(batch_norm(...)), 2) through kernels::batch_norm_relu_pool2d, whose entry point
// takes one fused kernel on CPU for float32 (kernels/batch_norm_pool.h: writes only pooled-size
// data, the output bitwise the unfused one; the backward goes from the pooled gradient to the
// input's without full-size intermediates) and composes batch_norm_relu and max_pool2d on other
// devices and dtypes. Same arguments as batch_norm; x must be [N, C, H, W].
Tensor batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                                  double eps = 1e-5);
// batch_norm_relu_max_pool2d(conv2d(x, conv_weight, conv_bias, stride, padding), ...): one fused op
// (kernels/conv_bn_pool.h) where it applies (CPU, float32 or float64, a one-channel 3x3 conv with stride 1
// and no padding, x needing no gradient, no autocast), the same values as the two calls; else those calls.
Tensor conv2d_batch_norm_relu_max_pool2d(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
                                         int64_t stride, int64_t padding, const Tensor& running_mean,
                                         const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                                         bool training, double momentum = 0.1, double eps = 1e-5);
Tensor relu(const Tensor& x);
// Square kernel, stride (default: the kernel), padding (at most half the kernel), dilation and
// ceil_mode as PyTorch's; [N, C, H, W] or unbatched [C, H, W]. With indices: nn/conv_pool.h.
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0, int64_t dilation = 1,
                  bool ceil_mode = false);
// x [..., in] (any rank >= 1; 2-D takes the CPU/CUDA kernel directly, other ranks are reshaped
// around it), weight [out, in], bias [out] or undefined -> [..., out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// Any dimension, through kernels::softmax_forward (whose entry point takes the rows' kernel for a
// 2-D input over its last dimension); a half input is computed in float32.
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
Tensor flatten(const Tensor& x, int64_t start_dim = 1);
Tensor reshape(const Tensor& x, const Shape& shape);

Tensor scale(const Tensor& a, double s);
Tensor sum(const Tensor& a);  // 0-D

}  // namespace tandem::nn::functional

namespace tandem {
namespace F = nn::functional;
}
