// Products, cumulative sums and sorting along one dimension, float32 and float64 on CPU
// (kernels/cpu/scan.cpp), float32 on CUDA (kernels/cuda/scan.cu). The input is read as a contiguous
// [outer, n, inner] block, n being the dimension's size; each (outer, inner) column is walked in
// order, accumulating in double and rounding each output once.
//   prod_dim: the product over dim (1 over an empty dimension), dropped or kept with size 1.
//   prod_dim_backward: grad (keepdim shape) times the product of the other elements of each
//     column: prefix times suffix products, exact with zeros (one zero: only it gets a gradient;
//     two: none), NaN and infinities propagating as in those products.
//   cumsum: out[k] = x[0] + ... + x[k] along dim (reverse: x[k] + ... + x[n-1], cumsum's backward).
//   argsort: int64 positions along dim that sort each column, ascending or descending, in PyTorch's
//     order: NaN above +inf (last ascending, first descending), -0.0 equal to 0.0, and ties in their
//     original order (stable, on every backend: a merge sort of each column).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::kernels {

Tensor prod_dim(const Tensor& x, int64_t dim, bool keepdim);
Tensor prod_dim_backward(const Tensor& grad, const Tensor& x, int64_t dim);
Tensor cumsum(const Tensor& x, int64_t dim, bool reverse = false);
Tensor argsort(const Tensor& x, int64_t dim, bool descending);

}  // namespace tandem::kernels
