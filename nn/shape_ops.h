// Differentiable views and copies, PyTorch's names and semantics. Views (view, permute, transpose,
// narrow, slice, select, unsqueeze, squeeze, expand; reshape when the input is contiguous) share
// the input's storage (core/view.h, core/tensor.h); their backward maps the gradient back to the
// input's shape: permuted back, written into zeros at the viewed positions, or summed over the
// expanded dimensions. cat, stack, index_select and gather copy (kernels/index.h: CPU and CUDA);
// split and chunk return narrow views.
// Bad dimensions, sizes and indices throw tandem::Error naming the op and the argument.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::nn::functional {

Tensor view(const Tensor& x, const Shape& shape);  // x contiguous; one -1 allowed
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
// x[start:end:step] along dim (Python's clamping of start/end; step > 0).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);  // drops dim
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);  // -1 keeps a size
Tensor contiguous(const Tensor& x);                 // x itself when already contiguous

Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);  // equal shapes; new dimension dim
// Pieces of split_size along dim (the last may be smaller), or of the given sizes (summing to
// the dimension's size).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// ceil(size / chunks)-sized pieces, as PyTorch (may return fewer than `chunks`).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// index: int64 (or int32) 0-D/1-D; gradient: index_add into zeros (repeated indices accumulate).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// index: int64 with x's rank; gradient: scatter_add into zeros.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

}  // namespace tandem::nn::functional
