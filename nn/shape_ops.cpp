// nn/shape_ops.h. Each view op takes the view from core (views share storage), then records a node
// whose backward rebuilds the input-shaped gradient: ReshapeGrad for view/squeeze/unsqueeze,
// PermuteGrad (inverse permutation), ViewIntoZeros (narrow, slice, select: the gradient is copied
// into the same view of a zero tensor), ExpandGrad (kernels::sum_to); copies record CatGrad,
// IndexSelectGrad and GatherGrad.
#include "nn/shape_ops.h"

#include <functional>

#include "core/autograd.h"
#include "core/view.h"
#include "kernels/index.h"
#include "kernels/reduce.h"
#include "nn/functional.h"

namespace tandem::nn::functional {
namespace {

struct ReshapeGrad final : Node {
  Shape input_shape;
  std::string name() const override { return "ViewBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].reshape(input_shape)}; }
};

struct PermuteGrad final : Node {
  std::vector<int64_t> inverse;
  std::string name() const override { return "PermuteBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {views::permute(g[0], inverse).contiguous()};
  }
};

// Backward of narrow/slice/select: zeros of the input's shape with the gradient written into the
// same view of them (`take` re-applies the view).
struct ViewIntoZeros final : Node {
  Shape input_shape;
  std::function<Tensor(const Tensor&)> take;
  std::string name() const override { return "SliceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor out = Tensor::zeros(input_shape, g[0].dtype(), g[0].device());
    take(out).copy_(g[0]);
    return {out};
  }
};

struct ExpandGrad final : Node {
  Shape input_shape;
  std::string name() const override { return "ExpandBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {kernels::sum_to(g[0], input_shape)}; }
};

struct CatGrad final : Node {
  int64_t dim = 0;
  std::vector<int64_t> sizes;
  std::string name() const override { return "CatBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    std::vector<Tensor> out(sizes.size());
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (needs_input_grad(i)) out[i] = views::narrow(g[0], dim, at, sizes[i]).contiguous();
      at += sizes[i];
    }
    return out;
  }
};

struct IndexSelectGrad final : Node {
  Shape input_shape;
  int64_t dim = 0;
  Tensor index;
  std::string name() const override { return "IndexSelectBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Shape src_shape = input_shape;
    if (!src_shape.empty()) src_shape[dim] = index.numel();
    return {kernels::index_add(input_shape, dim, index, g[0].reshape(src_shape))};
  }
};

struct GatherGrad final : Node {
  Shape input_shape;
  int64_t dim = 0;
  Tensor index;
  std::string name() const override { return "GatherBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::scatter_add(input_shape, dim, index, g[0])};
  }
};

// Records `n` (input x, output y); y must be a fresh handle.
template <typename N>
Tensor recorded(Tensor y, const Tensor& x, std::shared_ptr<N> n) {
  if (autograd::any_requires_grad({x})) autograd::record(n, {x}, {&y});
  return y;
}

Tensor view_like(Tensor y, const Tensor& x) {
  if (!autograd::any_requires_grad({x})) return y;
  auto n = std::make_shared<ReshapeGrad>();
  n->input_shape = x.shape();
  return recorded(std::move(y), x, n);
}

Tensor into_zeros(Tensor y, const Tensor& x, std::function<Tensor(const Tensor&)> take) {
  if (!autograd::any_requires_grad({x})) return y;
  auto n = std::make_shared<ViewIntoZeros>();
  n->input_shape = x.shape();
  n->take = std::move(take);
  return recorded(std::move(y), x, n);
}

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) { return view_like(x.view(shape), x); }

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor y = views::permute(x, dims);
  if (!autograd::any_requires_grad({x})) return y;
  auto n = std::make_shared<PermuteGrad>();
  n->inverse.assign(dims.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i) n->inverse[views::wrap_dim(dims[i], x.dim(), "permute")] = i;
  return recorded(std::move(y), x, n);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> perm(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) perm[d] = d;
  if (x.dim() == 0) {
    views::wrap_dim(dim0, 0, "transpose");
    views::wrap_dim(dim1, 0, "transpose");
    return permute(x, perm);
  }
  std::swap(perm[views::wrap_dim(dim0, x.dim(), "transpose")], perm[views::wrap_dim(dim1, x.dim(), "transpose")]);
  return permute(x, perm);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Tensor y = views::narrow(x, dim, start, length);
  return into_zeros(std::move(y), x, [=](const Tensor& z) { return views::narrow(z, dim, start, length); });
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Tensor y = x.slice(dim, start, end, step);
  return into_zeros(std::move(y), x, [=](const Tensor& z) { return z.slice(dim, start, end, step); });
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  TANDEM_CHECK(x.dim() > 0, "select: cannot select from a 0-D tensor");
  Tensor y = x.select(dim, index);
  return into_zeros(std::move(y), x, [=](const Tensor& z) { return z.select(dim, index); });
}

Tensor unsqueeze(const Tensor& x, int64_t dim) { return view_like(views::unsqueeze(x, dim), x); }
Tensor squeeze(const Tensor& x) { return view_like(views::squeeze(x), x); }
Tensor squeeze(const Tensor& x, int64_t dim) { return view_like(views::squeeze(x, dim), x); }

Tensor expand(const Tensor& x, const Shape& shape) {
  Tensor y = views::expand(x, shape);
  if (!autograd::any_requires_grad({x})) return y;
  auto n = std::make_shared<ExpandGrad>();
  n->input_shape = x.shape();
  return recorded(std::move(y), x, n);
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return view_like(x.contiguous(), x);  // same shape: the gradient passes through
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  Tensor y = kernels::cat(xs, dim);
  bool any = false;
  for (const Tensor& t : xs) any = any || autograd::any_requires_grad({t});
  if (!any) return y;
  auto n = std::make_shared<CatGrad>();
  n->dim = views::wrap_dim(dim, xs[0].dim(), "cat");
  for (const Tensor& t : xs) {
    n->sizes.push_back(t.shape()[n->dim]);
    n->next_edges.push_back(autograd::gradient_edge(t));
  }
  y.set_grad_fn(n, 0);
  return y;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  TANDEM_CHECK(!xs.empty(), "stack: expected at least one tensor");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < xs.size(); ++i) {
    TANDEM_CHECK(xs[i].defined() && xs[i].shape() == xs[0].shape(), "stack: tensor ", i, " is ", xs[i].str(),
                 ", expected the shape of tensor 0 ", xs[0].str());
    parts.push_back(unsqueeze(xs[i], dim));
  }
  return cat(parts, dim);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  TANDEM_CHECK(x.dim() > 0, "split: cannot split a 0-D tensor");
  dim = views::wrap_dim(dim, x.dim(), "split");
  const int64_t size = x.shape()[dim];
  TANDEM_CHECK(split_size > 0 || (split_size == 0 && size == 0), "split: split_size must be positive, got ",
               split_size);
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < size; at += split_size) sizes.push_back(std::min(split_size, size - at));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, dim);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  TANDEM_CHECK(x.dim() > 0, "split: cannot split a 0-D tensor");
  dim = views::wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TANDEM_CHECK(s >= 0, "split: sizes must be non-negative, got ", s);
    total += s;
  }
  TANDEM_CHECK(total == x.shape()[dim], "split: sizes sum to ", total, " but dimension ", dim, " of ", x.str(),
               " has size ", x.shape()[dim]);
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, dim, at, s));
    at += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  TANDEM_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  TANDEM_CHECK(x.dim() > 0, "chunk: cannot chunk a 0-D tensor");
  const int64_t size = x.shape()[views::wrap_dim(dim, x.dim(), "chunk")];
  return split(x, std::max<int64_t>((size + chunks - 1) / chunks, size == 0 ? 0 : 1), dim);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor y = kernels::index_select(x, dim, index);
  if (!autograd::any_requires_grad({x})) return y;
  auto n = std::make_shared<IndexSelectGrad>();
  n->input_shape = x.shape();
  n->dim = x.dim() == 0 ? 0 : views::wrap_dim(dim, x.dim(), "index_select");
  n->index = index.to(kInt64).reshape({index.numel()});
  return recorded(std::move(y), x, n);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor y = kernels::gather(x, dim, index);
  if (!autograd::any_requires_grad({x})) return y;
  auto n = std::make_shared<GatherGrad>();
  n->input_shape = x.shape();
  n->dim = x.dim() == 0 ? 0 : views::wrap_dim(dim, x.dim(), "gather");
  n->index = index.to(kInt64).contiguous();
  return recorded(std::move(y), x, n);
}

}  // namespace tandem::nn::functional
