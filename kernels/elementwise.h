// Elementwise and reduction ops the autograd layer and the trainer need.
// Binary ops take operands of the same shape (no broadcasting); scale
// multiplies by a scalar; sum reduces everything to a 0-D tensor; argmax
// reduces a 2-D tensor over dim 1 to int64 [N].
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, double s);
Tensor sum(const Tensor& a);
Tensor argmax(const Tensor& a);

}  // namespace tandem::kernels
