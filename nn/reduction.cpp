// nn/reduction.h. sum, var, std, max/min (by dimension, over everything), amax/amin, prod and cumsum
// record their own nodes (kernels/reduce.h, scan.h, index.h); the min family runs the max kernels on
// -x. mean and logsumexp are compositions of differentiable ops, so their gradients follow from those.
#include "nn/reduction.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/view.h"
#include "kernels/index.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"
#include "kernels/scan.h"
#include "nn/functional.h"

namespace tandem::nn::functional {
namespace {

// The number of elements each output of a reduction over dims takes in.
int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

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
  std::string name() const override { return "MaxMinDimBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    if (input_shape.empty()) return {g[0].reshape({})};
    return {kernels::scatter_add(input_shape, dim, indices, g[0].reshape(indices.shape()))};
  }
};

// Evenly distributes the gradient among the elements equal to the maximum (or minimum): a NaN
// result gives NaN gradients to its whole reduction, as PyTorch's amax/amin.
struct AmaxBackward final : Node {
  Tensor x, y_kept;  // y with keepdim
  std::vector<int64_t> dims;
  std::string name() const override { return "AmaxAminBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor mask = kernels::compare(kernels::CompareOp::Eq, x, y_kept).to(x.dtype());
    const Tensor count = kernels::sum_dims(mask, dims, true);
    const Tensor share = kernels::binary(kernels::BinaryOp::Div, g[0].reshape(y_kept.shape()), count);
    return {kernels::binary(kernels::BinaryOp::Mul, mask, share)};
  }
};

// max(x) / min(x) over everything (PyTorch's evenly_distribute_backward): the gradient is shared
// evenly among the elements equal to the result, or among the NaNs when the result is NaN.
struct MaxAllBackward final : Node {
  Tensor x, y;  // y 0-D
  std::string name() const override { return "ExtremeAllBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    using kernels::CompareOp;
    const Tensor is_nan = kernels::compare(CompareOp::Ne, y, y);
    const Tensor mask = kernels::where(is_nan, kernels::compare(CompareOp::Ne, x, x).to(x.dtype()),
                                       kernels::compare(CompareOp::Eq, x, y).to(x.dtype()));
    const Tensor count = kernels::sum_dims(mask, {}, false);
    return {kernels::binary(kernels::BinaryOp::Mul, mask, kernels::binary(kernels::BinaryOp::Div, g[0], count))};
  }
};

Tensor scalar_of(double s, const Tensor& like) { return Tensor::full({}, s, like.dtype(), like.device()); }

// x's mean over dims, kept (no autograd): the double-accumulated sum over N, in x's dtype.
Tensor mean_kept(const Tensor& x, const std::vector<int64_t>& dims) {
  return kernels::binary(kernels::BinaryOp::Div, kernels::sum_dims(x, dims, true),
                         scalar_of(double(reduced_count(x.shape(), dims)), x));
}

// x - mean(x) over dims, the mean subtracted twice: d = x - m is exact for x near m, and
// d - mean(d) removes what m's rounding left (up to half a float32 step of the mean: ~5e-4 at 1e4),
// so data with a large mean (1e4 + noise) keeps the deviations of its noise.
Tensor centred(const Tensor& x, const std::vector<int64_t>& dims) {
  const Tensor d = kernels::binary(kernels::BinaryOp::Sub, x, mean_kept(x, dims));
  return kernels::binary(kernels::BinaryOp::Sub, d, mean_kept(d, dims));
}

// var and std: d var / dx = 2 (x - mean) / (N - correction) (PyTorch's var_backward); std's is var's of
// g / (2 std), zero where std is 0 (as PyTorch's std_backward: a constant row has no NaN gradient).
struct VarStdBackward final : Node {
  Tensor x, y_kept;  // y_kept: the output with keepdim (std only)
  std::vector<int64_t> dims;
  double denom = 0;  // max(0, N - correction)
  bool is_std = false;
  std::string name() const override { return is_std ? "StdBackward" : "VarBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    using kernels::BinaryOp;
    Tensor gk = g[0].reshape(views::reduced_shape(x.shape(), dims, true));
    if (is_std) {
      const Tensor zero = scalar_of(0.0, x);
      gk = kernels::where(kernels::compare(kernels::CompareOp::Eq, y_kept, zero), zero,
                          kernels::binary(BinaryOp::Div, gk, kernels::binary(BinaryOp::Mul, y_kept, scalar_of(2.0, x))));
    }
    const Tensor c = centred(x, dims);
    const Tensor scaled = kernels::binary(BinaryOp::Mul, gk, scalar_of(2.0 / denom, x));
    return {kernels::binary(BinaryOp::Mul, c, scaled)};
  }
};

// prod(x, dim), as PyTorch's prod_backward: grad * y / x when x holds no zero anywhere, else grad
// times the product of the other elements (prefix and suffix products, kernels::prod_dim_backward).
struct ProdBackward final : Node {
  Tensor x, y_kept;
  int64_t dim = 0;
  std::string name() const override { return "ProdBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor gk = g[0].reshape(y_kept.shape());
    const Tensor zero_count =
        kernels::sum_dims(kernels::compare(kernels::CompareOp::Eq, x, scalar_of(0.0, x)).to(x.dtype()), {}, false);
    if (x.dim() == 0 || zero_count.item<double>() > 0) return {kernels::prod_dim_backward(gk, x, dim)};
    using kernels::BinaryOp;
    return {kernels::binary(BinaryOp::Mul, gk, kernels::binary(BinaryOp::Div, y_kept, x))};
  }
};

struct CumsumBackward final : Node {
  int64_t dim = 0;
  std::string name() const override { return "CumsumBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {kernels::cumsum(g[0], dim, /*reverse=*/true)}; }
};

// sum(centred(x)^2) / denom over dims (NaN over an empty reduction: the mean is NaN).
Tensor variance_of(const Tensor& x, const std::vector<int64_t>& dims, double denom, bool keepdim) {
  const Tensor c = centred(x, dims);
  const Tensor ss = kernels::sum_dims(kernels::binary(kernels::BinaryOp::Mul, c, c), dims, keepdim);
  return kernels::binary(kernels::BinaryOp::Div, ss, scalar_of(denom, x));
}

Tensor var_or_std(const char* op, const Tensor& x, const std::vector<int64_t>& dims_in, double correction, bool keepdim,
                  bool is_std) {
  TANDEM_CHECK(x.defined(), op, ": operand is undefined");
  const auto dims = views::reduction_dims(dims_in, x.dim(), op);
  const double denom = std::max(0.0, double(reduced_count(x.shape(), dims)) - correction);
  Tensor y = variance_of(x, dims, denom, keepdim);
  if (is_std) y = kernels::unary(kernels::UnaryOp::Sqrt, y);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<VarStdBackward>();
    n->x = x.detach();
    n->dims = dims;
    n->denom = denom;
    n->is_std = is_std;
    if (is_std) n->y_kept = y.detach().reshape(views::reduced_shape(x.shape(), dims, true));
    autograd::record(n, {x}, {&y});
  }
  return y;
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
  return mul(sum(x, dims, keepdim), 1.0 / static_cast<double>(reduced_count(x.shape(), dims)));
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  return var_or_std("var", x, dims, correction, keepdim, /*is_std=*/false);
}

Tensor std(const Tensor& x, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  return var_or_std("std", x, dims, correction, keepdim, /*is_std=*/true);
}

Tensor prod(const Tensor& x, int64_t dim, bool keepdim) {
  TANDEM_CHECK(x.defined(), "prod: operand is undefined");
  Tensor y = kernels::prod_dim(x, dim, keepdim);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<ProdBackward>();
    n->x = x.detach();
    n->dim = views::wrap_dim(dim, x.dim(), "prod");
    n->y_kept = x.dim() == 0 ? y.detach() : y.detach().reshape(views::reduced_shape(x.shape(), {n->dim}, true));
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor prod(const Tensor& x) {
  TANDEM_CHECK(x.defined(), "prod: operand is undefined");
  return prod(reshape(x, {x.numel()}), 0, false);
}

Tensor cumsum(const Tensor& x, int64_t dim) {
  TANDEM_CHECK(x.defined(), "cumsum: operand is undefined");
  Tensor y = kernels::cumsum(x, dim);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<CumsumBackward>();
    n->dim = views::wrap_dim(dim, x.dim(), "cumsum");
    autograd::record(n, {x}, {&y});
  }
  return y;
}

namespace {

// The min family runs the max kernels on -x (negation is exact, so the first minimum of x is the
// first maximum of -x, NaN still winning) and negates the values back.
Tensor negated(const Tensor& x) { return kernels::unary(kernels::UnaryOp::Neg, x); }

// dim wrapped (0 for a 0-D x), after checking that x is defined and the dimension is not empty.
int64_t nonempty_dim(const char* op, const Tensor& x, int64_t dim) {
  TANDEM_CHECK(x.defined(), op, ": operand is undefined");
  const int64_t d = x.dim() == 0 ? 0 : views::wrap_dim(dim, x.dim(), op);
  if (x.dim() > 0) TANDEM_CHECK(x.shape()[d] > 0, op, ": cannot reduce the empty dimension ", d, " of ", x.str());
  return d;
}

MaxOutput extreme_dim(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool largest) {
  const int64_t d = nonempty_dim(op, x, dim);
  auto r = kernels::max_dim(largest ? x : negated(x), d, keepdim);
  if (!largest) r.values = negated(r.values);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<MaxDimBackward>();
    n->input_shape = x.shape();
    n->dim = d;
    n->indices = x.dim() == 0 ? r.indices : r.indices.reshape(views::reduced_shape(x.shape(), {d}, true));
    autograd::record(n, {x}, {&r.values});
  }
  return {r.values, r.indices};
}

Tensor extreme_all(const char* op, const Tensor& x, bool largest) {
  TANDEM_CHECK(x.defined(), op, ": operand is undefined");
  TANDEM_CHECK(x.numel() > 0, op, ": cannot reduce the empty tensor ", x.str(), " (give a dimension to reduce instead)");
  Tensor y = largest ? kernels::amax(x, {}, false) : negated(kernels::amax(negated(x), {}, false));
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<MaxAllBackward>();
    n->x = x.detach();
    n->y = y.detach();
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor extreme_dims(const char* op, const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim, bool largest) {
  TANDEM_CHECK(x.defined(), op, ": operand is undefined");
  const auto dims = views::reduction_dims(dims_in, x.dim(), op);
  for (int64_t k : dims) TANDEM_CHECK(x.shape()[k] > 0, op, ": cannot reduce the empty dimension ", k, " of ", x.str());
  Tensor y = largest ? kernels::amax(x, dims, keepdim) : negated(kernels::amax(negated(x), dims, keepdim));
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<AmaxBackward>();
    n->x = x.detach();
    n->y_kept = y.detach().reshape(views::reduced_shape(x.shape(), dims, true));
    n->dims = dims;
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor arg_extreme(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool largest) {
  const int64_t d = nonempty_dim(op, x, dim);
  return kernels::max_dim(largest ? x : negated(x), d, keepdim).indices;
}

Tensor arg_extreme_all(const char* op, const Tensor& x, bool largest) {
  TANDEM_CHECK(x.defined(), op, ": operand is undefined");
  TANDEM_CHECK(x.numel() > 0, op, ": cannot reduce the empty tensor ", x.str());
  return arg_extreme(op, x.reshape({x.numel()}), 0, false, largest);
}

}  // namespace

MaxOutput max(const Tensor& x, int64_t dim, bool keepdim) { return extreme_dim("max", x, dim, keepdim, true); }
Tensor max(const Tensor& x) { return extreme_all("max", x, true); }
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_dims("amax", x, dims, keepdim, true);
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return arg_extreme("argmax", x, dim, keepdim, true); }
Tensor argmax(const Tensor& x) { return arg_extreme_all("argmax", x, true); }

MaxOutput min(const Tensor& x, int64_t dim, bool keepdim) { return extreme_dim("min", x, dim, keepdim, false); }
Tensor min(const Tensor& x) { return extreme_all("min", x, false); }
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_dims("amin", x, dims, keepdim, false);
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return arg_extreme("argmin", x, dim, keepdim, false); }
Tensor argmin(const Tensor& x) { return arg_extreme_all("argmin", x, false); }

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  TANDEM_CHECK(x.defined(), "logsumexp: operand is undefined");
  const auto dims = views::reduction_dims(dims_in, x.dim(), "logsumexp");
  // Over an empty dimension: log(0) = -inf, as PyTorch (no maximum to shift by).
  Tensor m = reduced_count(x.shape(), dims) == 0 ? Tensor::zeros(views::reduced_shape(x.shape(), dims, true), x.dtype(), x.device())
                                         : kernels::amax(x.detach(), dims, true);
  // An infinite maximum would make x - m NaN; shift by 0 there instead (PyTorch does the same).
  const Tensor zero = Tensor::zeros({}, m.dtype(), m.device());
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {inf, -inf}) m = kernels::where(kernels::compare(kernels::CompareOp::Eq, m, Tensor::full({}, v, m.dtype(), m.device())), zero, m);
  Tensor y = add(log(sum(exp(sub(x, m)), dims, true)), m);
  return keepdim ? y : reshape(y, views::reduced_shape(x.shape(), dims, false));
}

}  // namespace tandem::nn::functional
