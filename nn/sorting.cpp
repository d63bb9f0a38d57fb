// nn/sorting.h: positions from kernels::argsort, values through the differentiable gather.
#include "nn/sorting.h"

#include "core/error.h"
#include "core/view.h"
#include "kernels/scan.h"
#include "nn/functional.h"
#include "nn/shape_ops.h"

namespace tandem::nn::functional {
namespace {

// The values of x at `indices` along dim (indices has x's rank; a 0-D x is its own value).
Tensor values_at(const Tensor& x, int64_t dim, const Tensor& indices) {
  if (x.dim() == 0) return reshape(gather(reshape(x, {1}), 0, indices.reshape({1})), {});
  return gather(x, dim, indices);
}

}  // namespace

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  TANDEM_CHECK(x.defined(), "argsort: operand is undefined");
  return kernels::argsort(x, dim, descending);
}

SortOutput sort(const Tensor& x, int64_t dim, bool descending) {
  TANDEM_CHECK(x.defined(), "sort: operand is undefined");
  Tensor indices = kernels::argsort(x, dim, descending);
  return {values_at(x, dim, indices), indices};
}

SortOutput topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool /*sorted*/) {
  TANDEM_CHECK(x.defined(), "topk: operand is undefined");
  const int64_t d = views::wrap_dim(dim, x.dim(), "topk");
  const int64_t size = x.dim() == 0 ? 1 : x.shape()[d];
  TANDEM_CHECK(x.dim() > 0 || k == 1, "topk: a 0-D tensor has one element, so k must be 1 (got ", k, ")");
  TANDEM_CHECK(k >= 0 && k <= size, "topk: k = ", k, " is out of range for dimension ", d, " of size ", size,
               " (expected 0 <= k <= ", size, ")");
  Tensor order = kernels::argsort(x, d, largest);
  Tensor indices = x.dim() == 0 ? order : narrow(order, d, 0, k).contiguous();
  return {values_at(x, d, indices), indices};
}

}  // namespace tandem::nn::functional
