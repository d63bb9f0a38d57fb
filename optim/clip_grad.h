// Gradient clipping by total norm, as torch.nn.utils.clip_grad_norm_: the norm of all gradients
// together (norm_type p; inf: the largest absolute value), then every gradient multiplied in place
// by clamp(max_norm / (total + 1e-6), max = 1). Parameters without a gradient are skipped.
// Assumes: the gradients are final (after DDP's reduction and AMP unscaling) and float32.
// Two ways, chosen by `foreach` (default: the device way when every gradient is on one CUDA device,
// as PyTorch's foreach path, else the host way):
//  - the host way: each gradient's part of the norm read to the host and summed in double; the
//    gradients are scaled only when the coefficient is below 1. Returns the norm as a float64 0-D
//    tensor on the host.
//  - the device way: the per-gradient parts stacked and reduced once on the gradients' device, the
//    coefficient computed and every gradient scaled there (by 1 when no clipping is needed): the
//    host reads nothing, so a GPU step is not synchronised. Returns the norm as a float32 0-D tensor
//    on that device; reading it (.item()) is the caller's choice, and waits for the device.
// Guarantees: returns the total norm before clipping (0 when no parameter has a gradient); throws
// tandem::Error for max_norm <= 0, norm_type < 1, or the device way with gradients on several
// devices (naming the value).
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"

namespace tandem::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       std::optional<bool> foreach = std::nullopt);

}  // namespace tandem::optim
