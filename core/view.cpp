#include "core/view.h"

#include <algorithm>

namespace tandem::views {

int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  TANDEM_CHECK(d >= -n && d < n, op, ": dimension ", d, " out of range for a ", ndim,
               "-D tensor (expected a dimension in [", -n, ", ", n - 1, "])");
  return d < 0 ? d + n : d;
}

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  const int64_t n = t.dim();
  TANDEM_CHECK(static_cast<int64_t>(dims.size()) == n, "permute: got ", dims.size(), " dimensions for ",
               t.str(), ", expected ", n);
  Shape shape(n), strides(n);
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = wrap_dim(dims[i], n, "permute");
    TANDEM_CHECK(!seen[d], "permute: dimension ", dims[i], " repeated; expected a permutation of 0..",
                 n - 1);
    seen[d] = true;
    shape[i] = t.shape()[d];
    strides[i] = t.strides()[d];
  }
  return as_strided(t, shape, strides, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  const int64_t n = t.dim();
  TANDEM_CHECK(dim >= -n - 1 && dim <= n, "unsqueeze: dimension ", dim, " out of range for ", t.str(),
               " (expected a dimension in [", -n - 1, ", ", n, "])");
  if (dim < 0) dim += n + 1;
  Shape shape = t.shape(), strides = t.strides();
  const int64_t stride = dim < n ? shape[dim] * strides[dim] : 1;
  shape.insert(shape.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  return as_strided(t, shape, strides, t.offset());
}

Tensor squeeze(const Tensor& t) {
  Shape shape, strides;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.shape()[d] == 1) continue;
    shape.push_back(t.shape()[d]);
    strides.push_back(t.strides()[d]);
  }
  return as_strided(t, shape, strides, t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  if (t.dim() == 0) {
    wrap_dim(dim, 0, "squeeze");
    return as_strided(t, t.shape(), t.strides(), t.offset());
  }
  dim = wrap_dim(dim, t.dim(), "squeeze");
  Shape shape = t.shape(), strides = t.strides();
  if (shape[dim] == 1) {
    shape.erase(shape.begin() + dim);
    strides.erase(strides.begin() + dim);
  }
  return as_strided(t, shape, strides, t.offset());
}

Tensor expand(const Tensor& t, const Shape& shape) {
  const int64_t n = static_cast<int64_t>(shape.size()), m = t.dim();
  TANDEM_CHECK(n >= m, "expand: cannot expand ", t.str(), " to ", shape_str(shape),
               " (the target has fewer dimensions)");
  Shape out(n), strides(n);
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t j = i - (n - m);
    const int64_t want = shape[i];
    if (j < 0) {
      TANDEM_CHECK(want >= 0, "expand: size -1 is not allowed for the new leading dimension ", i, " of ",
                   shape_str(shape));
      out[i] = want;
      strides[i] = 0;
      continue;
    }
    const int64_t have = t.shape()[j];
    if (want == -1 || want == have) {
      out[i] = have;
      strides[i] = t.strides()[j];
    } else {
      TANDEM_CHECK(have == 1, "expand: cannot expand ", t.str(), " to ", shape_str(shape), ": dimension ", i,
                   " has size ", have, ", expected 1 or ", want);
      out[i] = want;
      strides[i] = 0;
    }
  }
  return as_strided(t, out, strides, t.offset());
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  dim = wrap_dim(dim, t.dim(), "narrow");
  TANDEM_CHECK(t.dim() > 0, "narrow: cannot narrow a 0-D tensor");
  const int64_t size = t.shape()[dim];
  if (start < 0) start += size;
  TANDEM_CHECK(start >= 0 && start <= size, "narrow: start ", start, " out of range for dimension ", dim,
               " of ", t.str());
  TANDEM_CHECK(length >= 0 && start + length <= size, "narrow: start ", start, " + length ", length,
               " exceeds dimension ", dim, " of ", t.str());
  Shape shape = t.shape();
  shape[dim] = length;
  return as_strided(t, shape, t.strides(), t.offset() + start * t.strides()[dim]);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TANDEM_CHECK(x == y || x == 1 || y == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                 " do not broadcast (dimension ", i, " of the result: ", x, " vs ", y,
                 "; sizes must be equal or 1)");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

std::vector<int64_t> reduction_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, ndim, op);
    TANDEM_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dimension ", d,
                 " appears more than once in the reduction dimensions");
    out.push_back(w);
  }
  if (ndim == 0) out.clear();  // a 0-D tensor reduces over nothing (dim 0/-1 name the scalar)
  std::sort(out.begin(), out.end());
  return out;
}

void split_at(const Shape& shape, int64_t dim, int64_t& outer, int64_t& n, int64_t& inner) {
  outer = inner = 1;
  n = shape.empty() ? 1 : shape[dim];
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(shape.size()); ++d) inner *= shape[d];
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) {
      out.push_back(shape[d]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

}  // namespace tandem::views
