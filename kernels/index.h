// Indexing, concatenation and batched matrix products, float32 and float64 on CPU and on CUDA
// (kernels/cuda/index.cu: index_add and scatter_add add with atomics, so their float rounding may
// vary from run to run there). Indices are int64 (int32 accepted where PyTorch accepts it:
// index_select) on the operands' device; every index is checked against its dimension (on the
// host: a CUDA index is copied there first) and a bad one throws, naming its position and value.
//   index_select(x, dim, index[k])    out.size(dim) = k, out[.., i, ..] = x[.., index[i], ..]
//   index_add(shape, dim, index, src) zeros(shape) with src's slices added at index (the backward of
//                                     index_select); slices whose index equals skip are dropped
//   gather(x, dim, index)             out has index's shape, out[i][j][k] = x[i][index[i][j][k]][k]
//                                     (dim = 1); index.size(d) <= x.size(d) for d != dim
//   scatter_add(shape, dim, index, src) zeros(shape), then out[i][index[i][j][k]][k] += src[i][j][k]
//   cat(xs, dim)                      xs share dtype, rank and every size but dim's
//   bmm(a [B, M, K], b [B, K, N])     [B, M, N], Eigen GEMM per batch (CUDA: cuBLAS strided batched)
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "core/tensor.h"

namespace tandem::kernels {

constexpr int64_t kNoSkip = std::numeric_limits<int64_t>::min();

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src, int64_t skip = kNoSkip);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor bmm(const Tensor& a, const Tensor& b);

}  // namespace tandem::kernels
