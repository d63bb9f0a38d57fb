// nn/pointwise.h: each op runs its kernel entry point (kernels/pointwise.h, which picks the kernel)
// and, when an input requires grad, records a node saving detached operands. Binary nodes compute
// grad * d(a op b)/d(operand) at the broadcast shape and sum it back to each operand's shape
// (kernels::sum_to).
#include "nn/pointwise.h"

#include "core/autograd.h"
#include "kernels/amp.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"

namespace tandem::nn::functional {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

// Add and Sub keep only the operand shapes; the other ops keep the operands (and Div/Pow the output).
struct BinaryBackward final : Node {
  BinaryOp op;
  Shape a_shape, b_shape;
  Tensor a, b, y;
  std::string name() const override { return std::string(kernels::op_name(op)) + "Backward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    std::vector<Tensor> out(2);
    for (int which = 0; which < 2; ++which) {
      if (!needs_input_grad(which)) continue;
      // Add's and Sub's derivatives are 1 and -1: no operand is needed (none is saved).
      Tensor gi;
      if (op == BinaryOp::Add || op == BinaryOp::Sub) {
        gi = op == BinaryOp::Sub && which == 1 ? kernels::binary(BinaryOp::Mul, g[0], -1.0) : g[0];
      } else {
        gi = kernels::binary_backward(op, which, g[0], a, b, y);
      }
      out[which] = kernels::sum_to(gi, which == 0 ? a_shape : b_shape);
    }
    return out;
  }
};

// The backward of a dtype cast casts the gradient back to the source dtype.
struct CastBackward final : Node {
  DType from;
  std::string name() const override { return "CastBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {kernels::cast(g[0], from)}; }
};

// A 0-D tensor holding s, of t's dtype (float32 for a half t: it is computed in float32) and device.
Tensor scalar_like(double s, const Tensor& t) {
  TANDEM_CHECK(t.defined(), "scalar operand: the tensor operand is undefined");
  return Tensor::full({}, s, kernels::is_low_precision(t.dtype()) ? kFloat32 : t.dtype(), t.device());
}

Tensor record_binary(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  // The general kernels have no half path; float32 is PyTorch's promotion of a half and a float32 operand.
  const Tensor a = float32_if_half(a_in), b = float32_if_half(b_in);
  Tensor y = kernels::binary(op, a, b);
  if (autograd::any_requires_grad({a, b})) {
    auto n = std::make_shared<BinaryBackward>();
    n->op = op;
    n->a_shape = a.shape();
    n->b_shape = b.shape();
    if (op != BinaryOp::Add && op != BinaryOp::Sub) {
      n->a = a.detach();
      n->b = b.detach();
    }
    if (op == BinaryOp::Div || op == BinaryOp::Pow) n->y = y.detach();
    autograd::record(n, {a, b}, {&y});
  }
  return y;
}

struct WhereBackward final : Node {
  Tensor cond;
  Shape a_shape, b_shape;
  std::string name() const override { return "WhereBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = kernels::sum_to(kernels::where(cond, g[0], zero), a_shape);
    if (needs_input_grad(1)) gb = kernels::sum_to(kernels::where(cond, zero, g[0]), b_shape);
    return {ga, gb};
  }
};

struct UnaryBackward final : Node {
  UnaryOp op;
  Tensor x, y;
  std::string name() const override { return std::string(kernels::op_name(op)) + "Backward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::unary_backward(op, g[0], x, y)};
  }
};

// Passes the gradient where min <= x <= max (each bound when given), zero elsewhere (NaN included).
struct ClampBackward final : Node {
  Tensor x, min, max;  // a bound may be undefined
  std::string name() const override { return "ClampBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
    Tensor gx = g[0];
    if (min.defined()) gx = kernels::where(kernels::compare(kernels::CompareOp::Ge, x, min), gx, zero);
    if (max.defined()) gx = kernels::where(kernels::compare(kernels::CompareOp::Le, x, max), gx, zero);
    return {gx};
  }
};

Tensor record_unary(UnaryOp op, const Tensor& x_in) {
  const Tensor x = float32_if_half(x_in);  // no half kernels
  Tensor y = kernels::unary(op, x);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<UnaryBackward>();
    n->op = op;
    n->x = x.detach();
    n->y = y.detach();
    autograd::record(n, {x}, {&y});
  }
  return y;
}

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  if (!x.defined() || x.dtype() == dtype) return x;
  Tensor y = kernels::cast(x, dtype);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<CastBackward>();
    n->from = x.dtype();
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor float32_if_half(const Tensor& x) {
  return x.defined() && kernels::is_low_precision(x.dtype()) ? cast(x, kFloat32) : x;
}

Tensor add(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::Add, a, b); }
Tensor add(const Tensor& a, double b) { return record_binary(BinaryOp::Add, a, scalar_like(b, a)); }
Tensor sub(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::Sub, a, b); }
Tensor sub(const Tensor& a, double b) { return record_binary(BinaryOp::Sub, a, scalar_like(b, a)); }
Tensor mul(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::Mul, a, b); }
Tensor mul(const Tensor& a, double b) { return record_binary(BinaryOp::Mul, a, scalar_like(b, a)); }
Tensor div(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::Div, a, b); }
Tensor div(const Tensor& a, double b) { return record_binary(BinaryOp::Div, a, scalar_like(b, a)); }
Tensor pow(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::Pow, a, b); }
Tensor pow(const Tensor& a, double exponent) { return record_binary(BinaryOp::Pow, a, scalar_like(exponent, a)); }
Tensor pow(double base, const Tensor& b) { return record_binary(BinaryOp::Pow, scalar_like(base, b), b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::Minimum, a, b); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor y = kernels::where(cond, a, b);
  if (autograd::any_requires_grad({a, b})) {
    auto n = std::make_shared<WhereBackward>();
    n->cond = cond.detach();
    n->a_shape = a.shape();
    n->b_shape = b.shape();
    autograd::record(n, {a, b}, {&y});
  }
  return y;
}

#define TANDEM_COMPARE(fn, OP)                                                                        \
  Tensor fn(const Tensor& a, const Tensor& b) { return kernels::compare(kernels::CompareOp::OP, a, b); } \
  Tensor fn(const Tensor& a, double b) { return kernels::compare(kernels::CompareOp::OP, a, scalar_like(b, a)); }
TANDEM_COMPARE(eq, Eq)
TANDEM_COMPARE(ne, Ne)
TANDEM_COMPARE(lt, Lt)
TANDEM_COMPARE(le, Le)
TANDEM_COMPARE(gt, Gt)
TANDEM_COMPARE(ge, Ge)
#undef TANDEM_COMPARE

Tensor neg(const Tensor& x) { return record_unary(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return record_unary(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return record_unary(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return record_unary(UnaryOp::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return record_unary(UnaryOp::Rsqrt, x); }
Tensor tanh(const Tensor& x) { return record_unary(UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return record_unary(UnaryOp::Sigmoid, x); }
Tensor silu(const Tensor& x) { return record_unary(UnaryOp::Silu, x); }
Tensor abs(const Tensor& x) { return record_unary(UnaryOp::Abs, x); }

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  TANDEM_CHECK(x.defined(), "clamp: operand is undefined");
  TANDEM_CHECK(min.has_value() || max.has_value(), "clamp: expected a min or a max bound (or both), got neither");
  const Tensor lo = min ? scalar_like(*min, x) : Tensor(), hi = max ? scalar_like(*max, x) : Tensor();
  Tensor y = x;
  if (lo.defined()) y = kernels::binary(BinaryOp::Maximum, y, lo);
  if (hi.defined()) y = kernels::binary(BinaryOp::Minimum, y, hi);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<ClampBackward>();
    n->x = x.detach();
    n->min = lo;
    n->max = hi;
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor gelu(const Tensor& x, const std::string& approximate) {
  TANDEM_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be \"none\" or \"tanh\", got \"",
               approximate, "\"");
  return record_unary(approximate == "none" ? UnaryOp::Gelu : UnaryOp::GeluTanh, x);
}

}  // namespace tandem::nn::functional
