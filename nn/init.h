// PyTorch's default initialisation, drawn from a Generator (default: the
// process-wide one seeded by manual_seed).
#pragma once

#include "core/random.h"
#include "core/tensor.h"

namespace tandem::nn::init {

void uniform_(Tensor& t, double lo, double hi, Generator& gen = default_generator());
// kaiming_uniform_(a = sqrt(5)) as Conv2d/Linear.reset_parameters use it:
// bound = 1 / sqrt(fan_in).
// Normal(mean, std), as torch.nn.init.normal_ (Embedding's default: 0, 1).
void normal_(Tensor& t, double mean, double std, Generator& gen = default_generator());
void kaiming_uniform_default_(Tensor& t, int64_t fan_in, Generator& gen = default_generator());

}  // namespace tandem::nn::init
