// Device-neutral nll_loss and class-target entry points (kernels/loss.h): validate ranks and
// shapes, the int64 target, the class weights and grad_out, devices and dtypes; then nll_loss takes
// its fast path or composes the general form from other entry points. Target values are checked
// by the device kernels.
#include "kernels/loss.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/index.h"
#include "kernels/ops.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"

namespace tandem::kernels {
namespace {

void check_2d(const char* op, const char* what, const Tensor& t) {
  TANDEM_CHECK(t.defined() && t.dim() == 2, op, ": expected ", what, " [N, C], got ",
               t.defined() ? t.str() : "undefined tensor");
}

void check_operands(const char* op, const Tensor& log_probs, const Tensor& target, const NllLossArgs& a) {
  check_2d(op, "log_probs", log_probs);
  TANDEM_CHECK(target.defined(), op, ": target is undefined");
  TANDEM_CHECK(target.dtype() == kInt64, op, ": expected int64 class indices as target, got ", target.str());
  TANDEM_CHECK(target.dim() == 1 && target.size(0) == log_probs.size(0), op, ": expected target [",
               log_probs.size(0), "] (one class per row of ", shape_str(log_probs.shape()), "), got ",
               target.str());
  TANDEM_CHECK(!a.weight.defined() || (a.weight.dim() == 1 && a.weight.size(0) == log_probs.size(1)), op,
               ": weight must be [C] = [", log_probs.size(1), "], got ", a.weight.str());
}

bool fast(const NllLossArgs& a) { return !a.weight.defined() && a.reduction == Reduction::Mean; }

// From the target pass: each row's weight (0 where ignored), the mask of kept rows and the safe
// gather indices [M, 1].
struct RowWeights {
  Tensor w, kept, safe;
};

RowWeights row_weights(const Tensor& log_probs, const Tensor& target, const NllLossArgs& a) {
  const int64_t M = log_probs.size(0);
  const ClassTargets t = class_targets(target, log_probs.size(1), a.ignore_index, log_probs.dtype());
  const Tensor zero = Tensor::zeros({}, log_probs.dtype(), log_probs.device());
  RowWeights r{t.keep, compare(CompareOp::Gt, t.keep, zero), t.safe};
  if (a.weight.defined()) r.w = binary(BinaryOp::Mul, index_select(a.weight, 0, t.safe.reshape({M})), t.keep);
  return r;
}

// v where the row is kept, else 0: an ignored row adds nothing even where its picked value or its
// gradient is infinite (0 * inf would be NaN).
Tensor kept_only(const RowWeights& r, const Tensor& v) {
  return where(r.kept, v, Tensor::zeros({}, v.dtype(), v.device()));
}

}  // namespace

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& target, const NllLossArgs& a) {
  constexpr const char* op = "nll_loss_forward";
  profiler::Scope prof_scope(op);
  check_operands(op, log_probs, target, a);
  const Device device = common_device(op, {log_probs, target, a.weight});
  common_float_dtype(op, {log_probs, a.weight});
  if (fast(a)) return TANDEM_FAST_KERNEL(device, nll_loss_mean_forward)(log_probs, target, a.ignore_index);
  const RowWeights r = row_weights(log_probs, target, a);
  const Tensor picked = gather(log_probs, 1, r.safe).reshape({log_probs.size(0)});
  const Tensor loss = kept_only(r, binary(BinaryOp::Mul, binary(BinaryOp::Mul, picked, r.w), -1.0));
  if (a.reduction == Reduction::None) return loss;
  const Tensor total = sum_dims(loss, {}, false);
  if (a.reduction == Reduction::Sum) return total;
  return binary(BinaryOp::Div, total, sum_dims(r.w, {}, false));  // nothing kept: 0 / 0 = NaN
}

Tensor nll_loss_backward(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target,
                         const NllLossArgs& a) {
  constexpr const char* op = "nll_loss_backward";
  profiler::Scope prof_scope(op);
  check_operands(op, log_probs, target, a);
  const bool none = a.reduction == Reduction::None;
  TANDEM_CHECK(grad_out.defined(), op, ": grad_out is undefined");
  if (none) {
    TANDEM_CHECK(grad_out.shape() == Shape{log_probs.size(0)}, op, ": expected grad_out [", log_probs.size(0),
                 "] (the loss's shape), got ", grad_out.str());
  } else {
    TANDEM_CHECK(grad_out.numel() == 1, op, ": expected grad_out with one value (the loss's shape), got ",
                 grad_out.str());
  }
  const Device device = common_device(op, {grad_out, log_probs, target, a.weight});
  common_float_dtype(op, {grad_out, log_probs, a.weight});
  if (fast(a)) {
    return TANDEM_FAST_KERNEL(device, nll_loss_mean_backward)(grad_out, log_probs, target, a.ignore_index);
  }
  const RowWeights r = row_weights(log_probs, target, a);
  const Tensor g = none ? grad_out : grad_out.reshape({});
  Tensor per_row = binary(BinaryOp::Mul, r.w, g);
  if (a.reduction == Reduction::Mean) {
    // g / total weight; nothing kept (total 0) divides by 1 instead, so the gradient is zero.
    const Tensor total = sum_dims(r.w, {}, false);
    const Tensor zero = Tensor::zeros({}, total.dtype(), total.device());
    const Tensor nonzero = binary(BinaryOp::Add, total, compare(CompareOp::Eq, total, zero).to(total.dtype()));
    per_row = binary(BinaryOp::Div, per_row, nonzero);
  }
  const int64_t M = log_probs.size(0);
  const Tensor src = binary(BinaryOp::Mul, kept_only(r, per_row), -1.0).reshape({M, 1});
  return scatter_add(log_probs.shape(), 1, r.safe, src);
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
