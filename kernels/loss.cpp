// Device-neutral nll_loss and class-target entry points: validate ranks and
// shapes, the int64 target and the scalar grad_out, devices and dtypes, then
// route to cpu:: or cuda::. Target values are checked by the device kernels.
#include "kernels/loss.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

void check_2d(const char* op, const char* what, const Tensor& t) {
  TANDEM_CHECK(t.defined() && t.dim() == 2, op, ": expected ", what, " [N, C], got ",
               t.defined() ? t.str() : "undefined tensor");
}

void check_target(const char* op, const Tensor& log_probs, const Tensor& target) {
  TANDEM_CHECK(target.defined(), op, ": target is undefined");
  TANDEM_CHECK(target.dtype() == kInt64, op, ": expected int64 class indices as target, got ", target.str());
  TANDEM_CHECK(target.dim() == 1 && target.size(0) == log_probs.size(0), op, ": expected target [",
               log_probs.size(0), "] (one class per row of ", shape_str(log_probs.shape()), "), got ",
               target.str());
}

}  // namespace

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target) {
  constexpr const char* op = "nll_loss_forward";
  profiler::Scope prof_scope(op);
  check_2d(op, "log_probs", log_probs);
  check_target(op, log_probs, target);
  const Device device = common_device(op, {log_probs, target});
  common_float_dtype(op, {log_probs});
  return TANDEM_KERNEL(device, nll_loss_forward)(log_probs, target);
}

Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target) {
  constexpr const char* op = "nll_loss_backward";
  profiler::Scope prof_scope(op);
  check_2d(op, "log_probs", log_probs);
  check_target(op, log_probs, target);
  TANDEM_CHECK(grad_out.defined() && grad_out.numel() == 1, op,
               ": expected a scalar grad_out (the loss is a mean), got ",
               grad_out.defined() ? grad_out.str() : "undefined tensor");
  const Device device = common_device(op, {grad_out, log_probs, target});
  common_float_dtype(op, {grad_out, log_probs});
  return TANDEM_KERNEL(device, nll_loss_backward)(grad_out, log_probs, target);
}

ClassTargets class_targets(const Tensor& target, int64_t C, int64_t ignore_index, DType keep_dtype) {
  constexpr const char* op = "class_targets";
  profiler::Scope prof_scope(op);
  TANDEM_CHECK(target.defined() && target.dtype() == kInt64, op, ": expected int64 class indices, got ",
               target.defined() ? target.str() : "undefined tensor");
  TANDEM_CHECK(keep_dtype == kFloat32 || keep_dtype == kFloat64, op, ": keep must be float32 or float64, got ",
               dtype_name(keep_dtype));
  return TANDEM_KERNEL(target.device(), class_targets)(target, C, ignore_index, keep_dtype);
}

}  // namespace tandem::kernels
