// Reductions over dimensions and softmax on any dimension, float32 and float64 on CPU and on CUDA
// (kernels/cuda/reduce.cu: sums in double without the CPU's 1024-element blocks). `dims` lists
// dimensions (negative counts from the end; empty = all); each may appear once. Reduced dimensions
// are dropped, or kept with size 1 when keepdim. Sums accumulate in double (over the last
// dimensions: blocks of 1024 summed in the element type, then added in double; a sum over every
// dimension takes the whole-tensor fast path of kernels/ops.h, which adds its chunks' partial sums
// in chunk order).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::kernels {

Tensor sum_dims(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Sums a broadcast gradient back to `shape` (PyTorch's sum_to): leading dimensions that `shape`
// lacks and dimensions where `shape` has 1 are summed. Returns g itself when shapes match.
Tensor sum_to(const Tensor& g, const Shape& shape);

struct MaxResult {
  Tensor values, indices;  // indices: int64, position of the first maximum along dim (NaN wins)
};
MaxResult max_dim(const Tensor& x, int64_t dim, bool keepdim);
// max_dim's indices alone (int64); [N, C] over dim 1 takes the rows' fast path (no values).
Tensor argmax_dim(const Tensor& x, int64_t dim, bool keepdim);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);

// softmax (log = false) or log_softmax (log = true) along dim, and their backward from the output
// (log_softmax over dim 1 of [N, C] takes the rows' fast path: one pass per row).
Tensor softmax_forward(const Tensor& x, int64_t dim, bool log);
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log);

}  // namespace tandem::kernels
