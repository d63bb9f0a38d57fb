// Device-neutral elementwise and reduction entry points: check that binary
// operands have the same shape (no broadcasting), that argmax gets a non-empty
// 2-D tensor, devices and dtypes, then the kernel of their backend (kernels/ops.h). No math here.
#include "kernels/elementwise.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

Device check_binary(const char* op, const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.defined() && b.defined(), op, ": operands must be defined");
  TANDEM_CHECK(a.shape() == b.shape(), op, ": operands must have the same shape (no broadcasting), got ",
               a.str(), " and ", b.str());
  const Device device = common_device(op, {a, b});
  common_float_dtype(op, {a, b});
  return device;
}

Device check_unary(const char* op, const Tensor& a) {
  TANDEM_CHECK(a.defined(), op, ": operand is undefined");
  const Device device = common_device(op, {a});
  common_float_dtype(op, {a});
  return device;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  profiler::Scope prof_scope("add");
  return TANDEM_KERNEL(check_binary("add", a, b), add)(a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  profiler::Scope prof_scope("sub");
  return TANDEM_KERNEL(check_binary("sub", a, b), sub)(a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  profiler::Scope prof_scope("mul");
  return TANDEM_KERNEL(check_binary("mul", a, b), mul)(a, b);
}
Tensor scale(const Tensor& a, double s) {
  profiler::Scope prof_scope("scale");
  return TANDEM_KERNEL(check_unary("scale", a), scale)(a, s);
}
Tensor sum(const Tensor& a) {
  profiler::Scope prof_scope("sum");
  return TANDEM_KERNEL(check_unary("sum", a), sum)(a);
}

Tensor argmax(const Tensor& a) {
  profiler::Scope prof_scope("argmax");
  const Device device = check_unary("argmax", a);
  TANDEM_CHECK(a.dim() == 2, "argmax: expected a 2-D tensor [N, C], got ", a.str());
  TANDEM_CHECK(a.size(1) > 0, "argmax: cannot take the maximum of empty rows, got ", a.str());
  return TANDEM_KERNEL(device, argmax)(a);
}

}  // namespace tandem::kernels
