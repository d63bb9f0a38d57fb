// Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_: the norm of all gradients
// together (norm_type p; inf: the largest absolute value), then every gradient multiplied in place
// by clamp(max_norm / (total + 1e-6), max = 1). Parameters without a gradient are skipped.
// Assumes: the gradients are final (after DDP's reduction and AMP unscaling) and float32.
// Guarantees: returns the total norm before clipping (0 when no parameter has a gradient); throws
// tandem::Error for max_norm <= 0 or norm_type < 1 (naming the value).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tandem::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace tandem::optim
