// The mean negative log-likelihood of log-probabilities [N, C] at int64 targets [N] with values in
// [0, C) (log_softmax is kernels::softmax_forward with log, kernels/reduce.h). nll_loss_forward
// returns a 0-D tensor; an out-of-range target throws, naming the row and the value.
// class_targets(target, C, ignore_index, keep_dtype): cross_entropy's pass over its int64
// targets (any shape, M values): keep [M] of keep_dtype, 1 where the target is a class and 0 where
// it is ignore_index; safe [M, 1] int64, the target where kept and 0 where ignored (a gather index
// always in range). A target neither in [0, C) nor ignore_index is an error: the CPU throws at
// once naming the position and the value; CUDA skips it (keep 0, safe 0) and reports it through
// the deferred kernel-error record (core/cuda/context.h), thrown at the next read from the device.
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

struct ClassTargets {
  Tensor keep, safe;
};

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target);
Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target);
ClassTargets class_targets(const Tensor& target, int64_t C, int64_t ignore_index, DType keep_dtype);

}  // namespace tandem::kernels
