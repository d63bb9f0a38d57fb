// relu. Backward works from the output y (y > 0 exactly where x > 0), so the
// input need not be saved.
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

Tensor relu_forward(const Tensor& x);
Tensor relu_backward(const Tensor& grad_out, const Tensor& y);

}  // namespace tandem::kernels
