// Fused optimizer updates: one pass over a parameter, its gradient and its
// state, applying the per-element functors of kernels/functors.h. All tensors
// contiguous, same shape, dtype and device.
#pragma once

#include "core/tensor.h"
#include "kernels/functors.h"

namespace tandem::kernels {

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& step);
void adadelta_update(const Tensor& param, const Tensor& grad, const Tensor& square_avg,
                     const Tensor& acc_delta, const AdadeltaStep& step);
void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamStep& step);

}  // namespace tandem::kernels
