// log_softmax over the last dimension of a 2-D x [N, C], and the mean
// negative log-likelihood of int64 targets [N] with values in [0, C).
// nll_loss_forward returns a 0-D tensor; an out-of-range target throws,
// naming the row and the value.
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

Tensor log_softmax_forward(const Tensor& x);
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& y);
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target);
Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target);

namespace cpu {
Tensor log_softmax_forward(const Tensor& x);
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& y);
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target);
Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target);
}  // namespace cpu

namespace cuda {
Tensor log_softmax_forward(const Tensor& x);
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& y);
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target);
Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target);
}  // namespace cuda

}  // namespace tandem::kernels
