// View helpers beyond core/tensor.h's: permute, expand (broadcast strides of 0), unsqueeze,
// squeeze, narrow, and the shape arithmetic the general op set shares (dimension wrapping,
// broadcasting two shapes, reduction-dimension lists). Like Tensor's own views they share storage
// and carry no autograd history; the differentiable versions live in nn/shape_ops.h.
// Guarantees: every malformed request (a dimension out of range, shapes that do not broadcast, a
// repeated dimension) throws tandem::Error naming the op, the argument and the tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::views {

// d in [-ndim, ndim) -> [0, ndim); for a 0-D tensor, -1 and 0 are accepted (PyTorch's rule).
int64_t wrap_dim(int64_t d, int64_t ndim, const char* op);

// A view of t's storage with any shape/strides/offset (no bounds check: the callers derive them).
Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);  // dims: a permutation
Tensor unsqueeze(const Tensor& t, int64_t dim);                     // dim in [-ndim-1, ndim]
Tensor squeeze(const Tensor& t);                                    // every size-1 dimension
Tensor squeeze(const Tensor& t, int64_t dim);                       // that one, if its size is 1
// Size-1 (or new leading) dimensions become `shape`'s sizes with stride 0; -1 keeps a size.
Tensor expand(const Tensor& t, const Shape& shape);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);

// The broadcast shape of a and b (PyTorch's rule: align from the right, sizes equal or 1).
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Sorted, wrapped, distinct dimensions; an empty list means every dimension.
std::vector<int64_t> reduction_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// The shape after reducing `dims` (sorted, wrapped) of `shape`, keeping them as 1 or dropping them.
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);
// A shape read as [outer, n, inner] around dimension dim (wrapped): the product of the sizes before
// it, its size, the product after it. A 0-D shape is [1, 1, 1].
void split_at(const Shape& shape, int64_t dim, int64_t& outer, int64_t& n, int64_t& inner);

}  // namespace tandem::views
