// nn/reduction.h. sum, max(dim) and amax record their own nodes (kernels/reduce.h, index.h); mean,
// var and logsumexp are compositions of differentiable ops, so their gradients follow from those.
#include "nn/reduction.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/view.h"
#include "kernels/index.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"
#include "nn/functional.h"

namespace tandem::nn::functional {
namespace {

// g (the reduced shape, with or without keepdim) broadcast back to the input's shape.
Tensor expand_back(const Tensor& g, const Shape& input_shape, const std::vector<int64_t>& dims) {
  const Tensor kept = g.reshape(views::reduced_shape(input_shape, dims, true));
  return views::expand(kept, input_shape).contiguous();
}

struct SumDimsBackward final : Node {
  Shape input_shape;
  std::vector<int64_t> dims;
  std::string name() const override { return "SumDimsBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {expand_back(g[0], input_shape, dims)}; }
};

struct MaxDimBackward final : Node {
  Shape input_shape;
  int64_t dim = 0;
  Tensor indices;  // keepdim shape
  std::string name() const override { return "MaxDimBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    if (input_shape.empty()) return {g[0].reshape({})};
    return {kernels::scatter_add(input_shape, dim, indices, g[0].reshape(indices.shape()))};
  }
};

// Evenly distributes the gradient among the elements equal to the maximum.
struct AmaxBackward final : Node {
  Tensor x, y_kept;  // y with keepdim
  std::vector<int64_t> dims;
  std::string name() const override { return "AmaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor mask = kernels::compare(kernels::CompareOp::Eq, x, y_kept).to(x.dtype());
    const Tensor count = kernels::sum_dims(mask, dims, true);
    const Tensor share = kernels::binary(kernels::BinaryOp::Div, g[0].reshape(y_kept.shape()), count);
    return {kernels::binary(kernels::BinaryOp::Mul, mask, share)};
  }
};

int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x.shape()[d];
  return n;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  TANDEM_CHECK(x.defined(), "sum: operand is undefined");
  const auto dims = views::reduction_dims(dims_in, x.dim(), "sum");
  Tensor y = kernels::sum_dims(x, dims, keepdim);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<SumDimsBackward>();
    n->input_shape = x.shape();
    n->dims = dims;
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  TANDEM_CHECK(x.defined(), "mean: operand is undefined");
  const auto dims = views::reduction_dims(dims_in, x.dim(), "mean");
  return mul(sum(x, dims, keepdim), 1.0 / static_cast<double>(reduced_count(x, dims)));
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims_in, double correction, bool keepdim) {
  TANDEM_CHECK(x.defined(), "var: operand is undefined");
  const auto dims = views::reduction_dims(dims_in, x.dim(), "var");
  const Tensor centred = sub(x, mean(x, dims, true));
  const double n = static_cast<double>(reduced_count(x, dims));
  return div(sum(mul(centred, centred), dims, keepdim), std::max(0.0, n - correction));
}

MaxOutput max(const Tensor& x, int64_t dim, bool keepdim) {
  TANDEM_CHECK(x.defined(), "max: operand is undefined");
  auto r = kernels::max_dim(x, dim, keepdim);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<MaxDimBackward>();
    n->input_shape = x.shape();
    n->dim = x.dim() == 0 ? 0 : views::wrap_dim(dim, x.dim(), "max");
    n->indices = x.dim() == 0 ? r.indices : r.indices.reshape(views::reduced_shape(x.shape(), {n->dim}, true));
    autograd::record(n, {x}, {&r.values});
  }
  return {r.values, r.indices};
}

Tensor max(const Tensor& x) { return amax(x, {}, false); }

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  TANDEM_CHECK(x.defined(), "amax: operand is undefined");
  const auto dims = views::reduction_dims(dims_in, x.dim(), "amax");
  Tensor y = kernels::amax(x, dims, keepdim);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<AmaxBackward>();
    n->x = x.detach();
    n->y_kept = y.detach().reshape(views::reduced_shape(x.shape(), dims, true));
    n->dims = dims;
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  TANDEM_CHECK(x.defined(), "argmax: operand is undefined");
  return kernels::max_dim(x, dim, keepdim).indices;
}

Tensor argmax(const Tensor& x) {
  TANDEM_CHECK(x.defined(), "argmax: operand is undefined");
  TANDEM_CHECK(x.numel() > 0, "argmax: cannot take the maximum of an empty tensor ", x.str());
  return kernels::max_dim(x.reshape({x.numel()}), 0, false).indices;
}

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  TANDEM_CHECK(x.defined(), "logsumexp: operand is undefined");
  const auto dims = views::reduction_dims(dims_in, x.dim(), "logsumexp");
  Tensor m = kernels::amax(x.detach(), dims, true);
  // An infinite maximum would make x - m NaN; shift by 0 there instead (PyTorch does the same).
  const Tensor zero = Tensor::zeros({}, m.dtype(), m.device());
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {inf, -inf}) m = kernels::where(kernels::compare(kernels::CompareOp::Eq, m, Tensor::full({}, v, m.dtype(), m.device())), zero, m);
  Tensor y = add(log(sum(exp(sub(x, m)), dims, true)), m);
  return keepdim ? y : reshape(y, views::reduced_shape(x.shape(), dims, false));
}

}  // namespace tandem::nn::functional
