// nll_loss over rows, as PyTorch's F.nll_loss on [N, C] log-probabilities with int64 targets [N]
// (nn::functional::nll_loss turns [C] and [N, C, d...] into rows): row i contributes
// -weight[t_i] * log_probs[i, t_i] when its target t_i is not ignore_index, and 0 when it is.
// Reduction::None gives those [N] values, Sum their sum (0-D), Mean their sum divided by the kept
// rows' total weight (their count without class weights; nothing kept: NaN, with a zero gradient,
// as PyTorch). A target neither in [0, C) nor ignore_index is an error: the CPU throws naming the row
// and the value; CUDA skips it and reports it through the deferred kernel-error record
// (core/cuda/context.h), thrown at the next read from the device. Mean without class weights takes
// the one-pass fast path (nll_loss_mean_forward/backward, counted in fast_path_count); every other
// form is composed of class_targets, gather, index_select, scatter_add and the pointwise kernels.
// class_targets(target, C, ignore_index, keep_dtype): the pass over int64 targets (any shape, M
// values) that nll_loss's composed path and cross_entropy's smoothing share: keep [M] of keep_dtype, 1
// where the target is a class and 0 where it is ignore_index; safe [M, 1] int64, the target where
// kept and 0 where ignored (a gather index always in range); bad targets reported as above.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::kernels {

struct ClassTargets {
  Tensor keep, safe;
};

enum class Reduction : uint8_t { None, Sum, Mean };

struct NllLossArgs {
  Tensor weight;  // [C], log_probs' dtype and device; undefined: every class weighs 1
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
};

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, const NllLossArgs& args);
// grad_out: 0-D for Sum and Mean, [N] for None.
Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target,
                         const NllLossArgs& args);
ClassTargets class_targets(const Tensor& target, int64_t C, int64_t ignore_index, DType keep_dtype);

}  // namespace tandem::kernels
