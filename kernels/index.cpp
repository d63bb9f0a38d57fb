// Device-neutral entry points of kernels/index.h: operands defined and on one device, dtypes,
// ranks, shapes and (host) index values checked; then cpu:: or cuda:: by that device. cat is a copy into
// slices of the output (Tensor::copy_, on either device), so it has no kernel of its own.
#include "kernels/index.h"

#include "core/profiler.h"
#include "core/view.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

// index as contiguous int64 on its own device; `op` names the op. A host index has every value
// checked here to be in [0, size), throwing at once. A CUDA index is not read here (that would wait
// for the device): the CUDA kernels check each value they read and report a bad one through the
// deferred kernel-error record (kernels/cuda/index.cu).
Tensor checked_index(const char* op, const Tensor& index, int64_t size) {
  TANDEM_CHECK(index.defined(), op, ": index is undefined");
  TANDEM_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, op, ": index must be int64 (or int32), got ",
               index.str());
  if (index.device().is_cuda()) return index.to(kInt64).contiguous();
  const Tensor idx = index.to(kInt64).contiguous();
  const int64_t* p = idx.data<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    TANDEM_CHECK(p[i] >= 0 && p[i] < size, op, ": index ", p[i], " at position ", i,
                 " is out of range for a dimension of size ", size, " (expected 0 <= index < ", size, ")");
  }
  return idx;
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  profiler::Scope prof_scope("index_select");
  TANDEM_CHECK(x.defined(), "index_select: input is undefined");
  TANDEM_CHECK(index.defined(), "index_select: index is undefined");
  const Device device = common_device("index_select", {x, index});
  common_float_dtype("index_select", {x});
  dim = views::wrap_dim(dim, x.dim(), "index_select");
  TANDEM_CHECK(index.dim() <= 1, "index_select: index must be 0-D or 1-D, got ", index.str());
  const Tensor idx = checked_index("index_select", index, x.dim() == 0 ? 1 : x.shape()[dim]);
  return TANDEM_KERNEL(device, index_select)(x, dim, idx.reshape({idx.numel()}));
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src, int64_t skip) {
  profiler::Scope prof_scope("index_add");
  TANDEM_CHECK(src.defined() && index.defined(), "index_add: source and index must be defined");
  const Device device = common_device("index_add", {src, index});
  common_float_dtype("index_add", {src});
  dim = views::wrap_dim(dim, static_cast<int64_t>(shape.size()), "index_add");
  const Tensor idx = checked_index("index_add", index, shape.empty() ? 1 : shape[dim]);
  Shape want = shape;
  if (!want.empty()) want[dim] = idx.numel();
  TANDEM_CHECK(src.shape() == want, "index_add: source ", src.str(), ", expected shape ", shape_str(want));
  return TANDEM_KERNEL(device, index_add)(shape, dim, idx.reshape({idx.numel()}), src, skip);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  profiler::Scope prof_scope("gather");
  TANDEM_CHECK(x.defined(), "gather: input is undefined");
  TANDEM_CHECK(index.defined(), "gather: index is undefined");
  const Device device = common_device("gather", {x, index});
  common_float_dtype("gather", {x});
  dim = views::wrap_dim(dim, x.dim(), "gather");
  TANDEM_CHECK(index.defined() && index.dim() == x.dim(), "gather: index must have the input's ", x.dim(),
               " dimensions, got ", index.str(), " for ", x.str());
  for (int64_t d = 0; d < x.dim(); ++d) {
    TANDEM_CHECK(d == dim || index.shape()[d] <= x.shape()[d], "gather: index ", index.str(),
                 " is larger than the input ", x.str(), " in dimension ", d);
  }
  const Tensor idx = checked_index("gather", index, x.dim() == 0 ? 1 : x.shape()[dim]);
  return TANDEM_KERNEL(device, gather)(x, dim, idx);
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  profiler::Scope prof_scope("scatter_add");
  TANDEM_CHECK(src.defined() && index.defined(), "scatter_add: source and index must be defined");
  const Device device = common_device("scatter_add", {src, index});
  common_float_dtype("scatter_add", {src});
  dim = views::wrap_dim(dim, static_cast<int64_t>(shape.size()), "scatter_add");
  TANDEM_CHECK(index.shape() == src.shape(), "scatter_add: index ", index.str(), " and source ", src.str(),
               " must have the same shape");
  const Tensor idx = checked_index("scatter_add", index, shape.empty() ? 1 : shape[dim]);
  return TANDEM_KERNEL(device, scatter_add)(shape, dim, idx, src);
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  profiler::Scope prof_scope("cat");
  TANDEM_CHECK(!xs.empty(), "cat: expected at least one tensor");
  const Tensor& first = xs[0];
  TANDEM_CHECK(first.defined() && first.dim() > 0, "cat: tensors must be defined and at least 1-D, got ",
               first.str());
  dim = views::wrap_dim(dim, first.dim(), "cat");
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& t = xs[i];
    TANDEM_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
    common_device("cat", {first, t});
    TANDEM_CHECK(t.dtype() == first.dtype(), "cat: tensor ", i, " is ", t.str(), ", expected ",
                 dtype_name(first.dtype()));
    TANDEM_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " is ", t.str(), ", expected ", first.dim(),
                 " dimensions like tensor 0 ", first.str());
    for (int64_t d = 0; d < first.dim(); ++d) {
      TANDEM_CHECK(d == dim || t.shape()[d] == first.shape()[d], "cat: tensor ", i, " is ", t.str(),
                   ", which differs from tensor 0 ", first.str(), " in dimension ", d, " (only dimension ",
                   dim, " may differ)");
    }
    total += t.shape()[dim];
  }
  Shape shape = first.shape();
  shape[dim] = total;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t at = 0;
  for (const Tensor& t : xs) {
    views::narrow(out, dim, at, t.shape()[dim]).copy_(t);
    at += t.shape()[dim];
  }
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  profiler::Scope prof_scope("bmm");
  TANDEM_CHECK(a.defined() && b.defined(), "bmm: operands must be defined");
  const Device device = common_device("bmm", {a, b});
  common_float_dtype("bmm", {a, b});
  TANDEM_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
               "bmm: expected [B, M, K] and [B, K, N], got ", a.str(), " and ", b.str());
  return TANDEM_KERNEL(device, bmm)(a, b);
}

}  // namespace tandem::kernels
