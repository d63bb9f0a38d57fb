// Sorting along one dimension, PyTorch's names and semantics: sort, argsort, topk. Each column is
// ordered by kernels::argsort (stable on every backend: ties keep their original order; NaN counts
// as larger than every number, so it comes last ascending and first descending, and topk's largest
// takes NaNs first; -0.0 equals 0.0). The values are gathered at those positions (nn::gather), so
// their gradient flows back to the positions they came from. float32 and float64 on CPU, float32
// on CUDA; a 0-D tensor sorts as one element (index 0).
//   topk(x, k, dim, largest, sorted): the k largest (or smallest) along dim, in sorted order
//     whatever `sorted` says (PyTorch leaves the order unspecified when sorted is false);
//     0 <= k <= size of dim, else an error naming k and the dimension's size.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "nn/reduction.h"  // MaxOutput

namespace tandem::nn::functional {

// values, and indices: int64, the positions along dim (the pair max(x, dim) returns).
using SortOutput = MaxOutput;

SortOutput sort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);  // int64, no gradient
SortOutput topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);

}  // namespace tandem::nn::functional
