// Device-neutral fused optimizer entry points: check that parameter,
// gradient and state share shape, dtype and device, and that the tensors
// updated in place are contiguous; then call the kernel of their backend (kernels/ops.h). The
// per-element math is in kernels/functors.h.
#include "kernels/optim.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

void check_same(const char* op, const char* what, const Tensor& param, const Tensor& t, bool in_place) {
  TANDEM_CHECK(t.defined(), op, ": ", what, " is undefined");
  TANDEM_CHECK(t.shape() == param.shape(), op, ": ", what, " ", t.str(), " does not match the parameter ",
               param.str());
  if (in_place) {
    TANDEM_CHECK(t.is_contiguous(), op, ": ", what, " ", t.str(),
                 " must be contiguous (it is updated in place)");
  }
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& step) {
  constexpr const char* op = "sgd_update";
  profiler::Scope prof_scope(op);
  check_same(op, "param", param, param, true);
  check_same(op, "grad", param, grad, false);
  if (step.momentum != 0.0f) {
    TANDEM_CHECK(momentum_buf.defined(), op, ": momentum ", step.momentum,
                 " needs a momentum buffer, got an undefined one");
  }
  if (momentum_buf.defined()) check_same(op, "momentum_buf", param, momentum_buf, true);
  const Device device = common_device(op, {param, grad, momentum_buf});
  common_float_dtype(op, {param, grad, momentum_buf});
  TANDEM_KERNEL(device, sgd_update)(param, grad, momentum_buf, step);
}

void adadelta_update(const Tensor& param, const Tensor& grad, const Tensor& square_avg,
                     const Tensor& acc_delta, const AdadeltaStep& step) {
  constexpr const char* op = "adadelta_update";
  profiler::Scope prof_scope(op);
  check_same(op, "param", param, param, true);
  check_same(op, "grad", param, grad, false);
  check_same(op, "square_avg", param, square_avg, true);
  check_same(op, "acc_delta", param, acc_delta, true);
  const Device device = common_device(op, {param, grad, square_avg, acc_delta});
  common_float_dtype(op, {param, grad, square_avg, acc_delta});
  TANDEM_KERNEL(device, adadelta_update)(param, grad, square_avg, acc_delta, step);
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamStep& step) {
  constexpr const char* op = "adam_update";
  profiler::Scope prof_scope(op);
  check_same(op, "param", param, param, true);
  check_same(op, "grad", param, grad, false);
  check_same(op, "exp_avg", param, exp_avg, true);
  check_same(op, "exp_avg_sq", param, exp_avg_sq, true);
  const Device device = common_device(op, {param, grad, exp_avg, exp_avg_sq});
  common_float_dtype(op, {param, grad, exp_avg, exp_avg_sq});
  TANDEM_KERNEL(device, adam_update)(param, grad, exp_avg, exp_avg_sq, step);
}

}  // namespace tandem::kernels
