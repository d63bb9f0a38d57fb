// Differentiable reductions over dimensions, PyTorch's names and semantics. `dims` lists
// dimensions (negative counts from the end; empty = all); each may appear once; reduced dimensions
// are dropped unless keepdim. float32 and float64 on CPU, float32 on CUDA (kernels/reduce.h;
// sum(x) over everything keeps its own kernel).
//   var: sum((x - mean)^2) / max(0, N - correction), N the number of reduced elements: correction 1
//        is PyTorch's unbiased=True (the default), 0 is unbiased=False.
//   max(x, dim): values and int64 indices (the first maximum); the gradient goes to that index.
//   max(x) and amax: the gradient is shared evenly among tied maxima, as PyTorch.
//   logsumexp: log(sum(exp(x))) computed around the (detached) maximum.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::nn::functional {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);  // 0-D
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1.0, bool keepdim = false);

struct MaxOutput {
  Tensor values, indices;
};
MaxOutput max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // 0-D
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // int64, no gradient
Tensor argmax(const Tensor& x);                                      // index into the flattened x
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

}  // namespace tandem::nn::functional
