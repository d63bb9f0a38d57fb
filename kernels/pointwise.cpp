// Device-neutral entry points of kernels/pointwise.h: operands defined, on one device, float dtypes
// shared, shapes broadcastable; then the kernel of that device's backend (kernels/ops.h). binary
// takes the same-shape add/sub/mul fast paths for same-shape Add, Sub and Mul (elementwise, no
// stride walk; the same values) and scale for Mul by a scalar, and binary_backward returns the
// gradient itself where it is the derivative (Add, Sub's first operand), scales it by -1 for Sub's
// second and multiplies same-shape Mul's by the other operand with the mul fast path. No math here.
#include "kernels/pointwise.h"

#include "core/profiler.h"
#include "core/view.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

Device check_float_pair(const char* op, const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.defined() && b.defined(), op, ": operands must be defined");
  const Device device = common_device(op, {a, b});
  common_float_dtype(op, {a, b});
  views::broadcast_shapes(a.shape(), b.shape(), op);
  return device;
}

}  // namespace

const char* op_name(BinaryOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};
  return names[static_cast<int>(op)];
}
const char* op_name(CompareOp op) {
  static const char* names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  return names[static_cast<int>(op)];
}
const char* op_name(UnaryOp op) {
  static const char* names[] = {"neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu",
                                "gelu_tanh", "silu", "abs"};
  return names[static_cast<int>(op)];
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  profiler::Scope prof_scope(op_name(op));
  const Device device = check_float_pair(op_name(op), a, b);
  if (a.shape() == b.shape()) {
    if (op == BinaryOp::Add) return TANDEM_FAST_KERNEL(device, add)(a, b);
    if (op == BinaryOp::Sub) return TANDEM_FAST_KERNEL(device, sub)(a, b);
    if (op == BinaryOp::Mul) return TANDEM_FAST_KERNEL(device, mul)(a, b);
  }
  return TANDEM_KERNEL(device, binary)(op, a, b);
}

Tensor binary(BinaryOp op, const Tensor& a, double b) {
  TANDEM_CHECK(a.defined(), op_name(op), ": operand is undefined");
  if (op != BinaryOp::Mul) return binary(op, a, Tensor::full({}, b, a.dtype(), a.device()));
  profiler::Scope prof_scope(op_name(op));
  const Device device = common_device(op_name(op), {a});
  common_float_dtype(op_name(op), {a});
  return TANDEM_FAST_KERNEL(device, scale)(a, b);
}

Tensor binary_backward(BinaryOp op, int which, const Tensor& grad, const Tensor& a, const Tensor& b,
                       const Tensor& y) {
  profiler::Scope prof_scope("binary_backward");
  check_float_pair(op_name(op), a, b);
  const Device device = common_device(op_name(op), {grad, a, b, y});
  common_float_dtype(op_name(op), {grad, a, b, y});
  TANDEM_CHECK(which == 0 || which == 1, op_name(op), " backward: operand ", which, " of 2");
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), op_name(op));
  TANDEM_CHECK(grad.shape() == shape, op_name(op), " backward: gradient ", grad.str(), ", expected shape ",
               shape_str(shape));
  if (op == BinaryOp::Add || (op == BinaryOp::Sub && which == 0)) return grad;
  if (op == BinaryOp::Sub) return TANDEM_FAST_KERNEL(device, scale)(grad, -1.0);
  if (op == BinaryOp::Mul && a.shape() == b.shape()) {
    return TANDEM_FAST_KERNEL(device, mul)(grad, which == 0 ? b : a);
  }
  return TANDEM_KERNEL(device, binary_backward)(op, which, grad, a, b, y);
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  profiler::Scope prof_scope(op_name(op));
  return TANDEM_KERNEL(check_float_pair(op_name(op), a, b), compare)(op, a, b);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  profiler::Scope prof_scope("where");
  check_float_pair("where", a, b);
  TANDEM_CHECK(cond.defined(), "where: condition must be defined");
  const Device device = common_device("where", {cond, a, b});
  TANDEM_CHECK(cond.dtype() == kUInt8, "where: the condition must be a uint8 mask (as eq/lt/... return), got ",
               cond.str());
  views::broadcast_shapes(cond.shape(), views::broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  return TANDEM_KERNEL(device, where)(cond, a, b);
}

Tensor unary(UnaryOp op, const Tensor& x) {
  profiler::Scope prof_scope(op_name(op));
  TANDEM_CHECK(x.defined(), op_name(op), ": operand is undefined");
  const Device device = common_device(op_name(op), {x});
  common_float_dtype(op_name(op), {x});
  return TANDEM_KERNEL(device, unary)(op, x);
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  profiler::Scope prof_scope("unary_backward");
  const Device device = common_device(op_name(op), {grad, x, y});
  common_float_dtype(op_name(op), {grad, x, y});
  TANDEM_CHECK(grad.shape() == x.shape() && y.shape() == x.shape(), op_name(op),
               " backward: gradient ", grad.str(), " does not match the input ", x.str());
  return TANDEM_KERNEL(device, unary_backward)(op, grad, x, y);
}

Tensor dropout_mask(const Shape& shape, double p, DType dtype, Device device, Generator& gen) {
  TANDEM_CHECK(p >= 0.0 && p < 1.0, "dropout: probability must be in [0, 1), got ", p);
  TANDEM_CHECK(dtype == kFloat32 || (dtype == kFloat64 && device.is_cpu()),
               "dropout: expected float32 (or float64 on CPU), got ", dtype_name(dtype), " on ", device.str());
  profiler::Scope prof_scope("dropout_mask");
  // Errors name the user's op, dropout.
  return kernel_for<&Backend::dropout_mask>(device, "dropout")(shape, p, dtype, device, gen);
}

}  // namespace tandem::kernels
