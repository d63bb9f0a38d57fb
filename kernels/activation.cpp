// Device-neutral relu entry points: check shapes, devices and dtypes, then
// call the kernel of their backend (kernels/ops.h). No math here.
#include "kernels/activation.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {

// [op-entry]
Tensor relu_forward(const Tensor& x) {
  constexpr const char* op = "relu_forward";
  profiler::Scope prof_scope(op);
  TANDEM_CHECK(x.defined(), op, ": input is undefined");
  const Device device = common_device(op, {x});
  common_float_dtype(op, {x});
  return TANDEM_KERNEL(device, relu_forward)(x);
}
// [op-entry]

Tensor relu_backward(const Tensor& grad_out, const Tensor& y) {
  constexpr const char* op = "relu_backward";
  profiler::Scope prof_scope(op);
  TANDEM_CHECK(grad_out.defined() && y.defined(), op, ": grad_out and the forward output must be defined");
  TANDEM_CHECK(grad_out.shape() == y.shape(), op, ": grad_out ", grad_out.str(),
               " does not match the forward output ", y.str());
  const Device device = common_device(op, {grad_out, y});
  common_float_dtype(op, {grad_out, y});
  return TANDEM_KERNEL(device, relu_backward)(grad_out, y);
}

}  // namespace tandem::kernels
