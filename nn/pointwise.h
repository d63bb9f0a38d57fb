// Differentiable elementwise ops with PyTorch's names and broadcasting (align shapes from the
// right; sizes equal or 1). Gradients are summed back over the broadcast dimensions (PyTorch's
// sum_to), so a [C] bias added to [N, C] gets a [C] gradient. Scalar forms take a double as the
// right operand (pow also as the left), held as a 0-D tensor of the other operand's dtype.
// Same-shape add/sub/mul take the elementwise fast paths of kernels::binary; everything else runs
// the general kernels (kernels/pointwise.h): float32 and float64 on CPU and on CUDA. A float16/bfloat16 operand
// of a binary op is cast up to float32 first (PyTorch's promotion with a float32 operand).
// Comparisons return uint8 masks (0/1: torch.bool's byte layout; see kernels/pointwise.h) with no
// gradient; `where` takes such a mask.
#pragma once

#include <optional>
#include <string>

#include "core/tensor.h"

namespace tandem::nn::functional {

// x in `dtype` (PyTorch's x.to(dtype)); the gradient is cast back to x's dtype. Undefined and
// same-dtype tensors pass through.
Tensor cast(const Tensor& x, DType dtype);
// cast(x, kFloat32) for a float16/bfloat16 x, else x: ops without half kernels (the binary ops,
// layer_norm, embedding, MultiheadAttention's heads) compute a half operand in float32.
Tensor float32_if_half(const Tensor& x);

Tensor add(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor pow(double base, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// cond ? a : b elementwise, all three broadcast; gradients flow to a where cond, to b elsewhere.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
// approximate: "none" (x * Phi(x), with erf) or "tanh"; anything else throws.
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor silu(const Tensor& x);
// |x| (NaN stays NaN); the gradient is grad * sign(x), 0 at x = 0 and at NaN, as PyTorch.
Tensor abs(const Tensor& x);
// min(max(x, min), max), either bound optional (not both): NaN stays NaN, and min > max gives max
// everywhere, as PyTorch. The gradient passes where min <= x <= max (bounds included) and is 0
// elsewhere, at NaN too. Runs the maximum/minimum kernels, so every device they support.
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

}  // namespace tandem::nn::functional
