// Losses of the general op set, PyTorch's names and semantics (float32/float64 on CPU and CUDA).
//   cross_entropy(input, target): input [N, C] or [N, C, d1, ...] logits (or [C] with a 0-D
//       target), target int64 class indices [N] or [N, d1, ...]. log_softmax over the class
//       dimension, then the negative log-likelihood of the target class; targets equal to
//       ignore_index contribute nothing, and "mean" divides by the number of targets not ignored
//       (NaN when all are, as PyTorch). label_smoothing s in [0, 1] mixes in the uniform
//       distribution: loss = (1 - s) * nll + s / C * (-sum_c log p_c). Other target values
//       outside [0, C) throw, naming the position and the value.
//       weight [C] (optional, the input's dtype and device): each element's nll is multiplied by
//       w[target], the smoothing term's log p_c by w_c, and "mean" divides by the sum of w[target]
//       over the targets not ignored (PyTorch's rule; NaN when that is 0).
//       A floating target of the input's shape holds class probabilities q: loss = -sum_c w_c q_c
//       log p_c with q smoothed as (1 - s) q + s / C; "mean" divides by the number of elements
//       (N x d1 x ...), whatever the weights; ignore_index does not apply.
//   nll_loss(input, target, weight, ignore_index, reduction): PyTorch's F.nll_loss: input [N, C] or
//       [N, C, d1, ...] log-probabilities (or [C] with a 0-D target), target int64 [N] or
//       [N, d1, ...]; each element's loss is -w[target] * input[.., target, ..] (w = 1 without
//       weights), 0 where the target is ignore_index; "mean" divides by the sum of w[target] over
//       the targets not ignored (NaN when that is 0, with a zero gradient). Other target values
//       outside [0, C) throw, naming the position and the value. A f16/bf16 input is computed in
//       float32. kernels::nll_loss_forward does the work (kernels/loss.h).
//   mse_loss(input, target): (input - target)^2, broadcast, reduced.
// reduction: "mean" (default), "sum" or "none" (the per-element losses, target's shape).
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace tandem::nn::functional {

Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, const std::string& reduction = "mean");
Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, const std::string& reduction = "mean");
Tensor nll_loss(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(), int64_t ignore_index = -100,
                const std::string& reduction = "mean");
Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

}  // namespace tandem::nn::functional
