// Differentiable reductions over dimensions, PyTorch's names and semantics. `dims` lists
// dimensions (negative counts from the end; empty = all); each may appear once; reduced dimensions
// are dropped unless keepdim. float32 and float64 on CPU and on CUDA, but prod and cumsum: float32 on CUDA
// (kernels/reduce.h, kernels/scan.h; a sum over everything takes the whole-tensor fast path).
//   var: sum((x - mean)^2) / max(0, N - correction), N the number of reduced elements: correction 1
//        is PyTorch's unbiased=True (the default), 0 is unbiased=False. The mean is subtracted
//        twice (d = x - mean, then d - mean(d)), so a large mean (1e4 + noise) does not swamp the
//        variance or its gradient; NaN over an empty reduction or where N <= correction.
//   std: sqrt(var), same arguments; its gradient is 0 where std is 0 (a constant row), as PyTorch.
//   prod(x, dim): 1 over an empty dimension; accumulated in double. Gradient as PyTorch's: grad * y / x
//        when x holds no zero anywhere (so a NaN or inf spreads over its row), else grad times the
//        product of the other elements (exact with zeros: one zero alone gets the gradient).
//   cumsum(x, dim): running sums along dim in double; the gradient is the reversed running sum.
//   max(x, dim): values and int64 indices (the first maximum, a NaN counting as the maximum); the
//        gradient goes to that index.
//   max(x) and amax: the gradient is shared evenly among tied maxima, as PyTorch; where the result
//        is NaN, max(x) shares it among the NaNs and amax gives NaN to the whole reduction (PyTorch's
//        two rules). An empty reduction throws, naming the dimension.
//   min, amin, argmin: the same with minimum for maximum (a NaN still wins).
//   logsumexp: log(sum(exp(x))) computed around the (detached) maximum; -inf over an empty dimension.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::nn::functional {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);  // 0-D
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1.0, bool keepdim = false);
Tensor std(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1.0, bool keepdim = false);
Tensor prod(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor prod(const Tensor& x);  // 0-D, over everything
Tensor cumsum(const Tensor& x, int64_t dim);

struct MaxOutput {
  Tensor values, indices;
};
MaxOutput max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // 0-D
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // int64, no gradient
Tensor argmax(const Tensor& x);                                      // index into the flattened x
MaxOutput min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor min(const Tensor& x);  // 0-D
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);  // int64, no gradient
Tensor argmin(const Tensor& x);                                      // index into the flattened x
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

}  // namespace tandem::nn::functional
