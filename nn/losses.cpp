// nn/losses.h. nll_loss records one node over kernels::nll_loss_forward/backward (kernels/loss.h),
// and cross_entropy without label smoothing is log_softmax then that nll_loss. The other forms are
// composed of differentiable ops (log_softmax, gather, index_select, sum, mul), whose gradients
// follow from theirs; their target is checked and turned into a keep mask by
// kernels::class_targets on its device: a host target throws at once, a CUDA one reports through
// the deferred kernel-error record.
#include "nn/losses.h"

#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/view.h"
#include "kernels/reduce.h"
#include "kernels/loss.h"
#include "nn/functional.h"

namespace tandem::nn::functional {
namespace {

struct NllLossBackward final : Node {
  Tensor log_probs, target;
  kernels::NllLossArgs args;
  std::string name() const override { return "NllLossBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::nll_loss_backward(g[0], log_probs, target, args)};
  }
};

void check_reduction(const char* op, const std::string& reduction) {
  TANDEM_CHECK(reduction == "mean" || reduction == "sum" || reduction == "none", op,
               ": reduction must be \"mean\", \"sum\" or \"none\", got \"", reduction, "\"");
}

// x [C], [N, C] or [N, C, d1, ...] as [M, C]: the class dimension last, one row per element.
Tensor class_last(const Tensor& x, int64_t M, int64_t C) {
  Tensor t = x;
  if (x.dim() == 1) {
    t = unsqueeze(x, 0);
  } else if (x.dim() > 2) {
    std::vector<int64_t> perm{0};
    for (int64_t d = 2; d < x.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    t = permute(x, perm);
  }
  return reshape(t, {M, C});
}

// sum(loss) / divisor, where divisor (0-D, no gradient wanted through a zero) may be 0: then NaN with
// a zero gradient, as PyTorch's mean over nothing kept. The divisor is read on the host only when
// it lives there.
Tensor mean_over(const Tensor& loss, const Tensor& divisor) {
  if (divisor.device().is_cpu()) {
    const double k = divisor.dtype() == kFloat64 ? divisor.item<double>() : divisor.item<float>();
    if (k == 0) return add(sum(loss), std::numeric_limits<double>::quiet_NaN());
    return div(sum(loss), divisor.detach());
  }
  const Tensor d = divisor.detach();
  const Tensor none_kept = eq(d, 0.0).to(d.dtype());  // 1 when nothing is kept, else 0
  const Tensor nan_if_none = sub(div(d, d), 1.0);     // d / d: 1, or NaN for 0 / 0
  return add(div(sum(loss), add(d, none_kept)), nan_if_none);
}

// The class layout of a loss's input [C], [N, C] or [N, C, d1, ...]: the class dimension, the
// number of classes, the per-element shape (the target's) and its element count; checks the
// optional class weights against it.
struct ClassLayout {
  int64_t class_dim, C;
  Shape per_element;
  int64_t M;
};

ClassLayout class_layout(const char* op, const Tensor& input, const Tensor& weight) {
  ClassLayout l{input.dim() == 1 ? 0 : 1, 0, input.shape(), 0};
  l.C = input.shape()[l.class_dim];
  l.per_element.erase(l.per_element.begin() + l.class_dim);
  l.M = shape_numel(l.per_element);
  TANDEM_CHECK(!weight.defined() || (weight.dim() == 1 && weight.size(0) == l.C && weight.dtype() == input.dtype() &&
                                     weight.device() == input.device()),
               op, ": weight must be [C] = [", l.C, "] of the input's dtype and device, got ", weight.str());
  return l;
}

kernels::Reduction reduction_of(const std::string& reduction) {
  if (reduction == "none") return kernels::Reduction::None;
  return reduction == "sum" ? kernels::Reduction::Sum : kernels::Reduction::Mean;
}

// nll_loss of rows lp [M, C] at targets [M] (on lp's device), the per-element result reshaped to
// none_shape for "none". The weight gets no gradient (PyTorch's nll_loss has none for it).
Tensor nll_loss_rows(const Tensor& lp, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                     const std::string& reduction, const Shape& none_shape) {
  const kernels::NllLossArgs args{weight.defined() ? weight.detach() : Tensor(), ignore_index, reduction_of(reduction)};
  Tensor loss = kernels::nll_loss_forward(lp, target, args);
  if (autograd::any_requires_grad({lp})) {
    auto n = std::make_shared<NllLossBackward>();
    n->log_probs = lp.detach();
    n->target = target;
    n->args = args;
    autograd::record(n, {lp}, {&loss});
  }
  return args.reduction == kernels::Reduction::None ? reshape(loss, none_shape) : loss;
}

Tensor reduce_loss(const Tensor& loss, const Shape& none_shape, const std::string& reduction, const Tensor& divisor) {
  if (reduction == "none") return reshape(loss, none_shape);
  if (reduction == "sum") return sum(loss);
  return mean_over(loss, divisor);
}

// Class-probability targets (target: input's shape, floating): -sum_c w_c q_c log p_c per element,
// q = (1 - s) target + s / C; "mean" divides by the number of elements (PyTorch's rule).
Tensor cross_entropy_probabilities(const Tensor& lp, const Tensor& target, const Tensor& weight,
                                   double label_smoothing, const Shape& none_shape, const std::string& reduction) {
  const int64_t M = lp.size(0), C = lp.size(1);
  Tensor q = class_last(target, M, C);
  if (label_smoothing > 0.0) q = add(mul(q, 1.0 - label_smoothing), label_smoothing / static_cast<double>(C));
  Tensor terms = mul(lp, q);
  if (weight.defined()) terms = mul(terms, weight);
  const Tensor loss = neg(sum(terms, {1}));
  return reduce_loss(loss, none_shape, reduction, Tensor::full({}, static_cast<double>(M), lp.dtype(), lp.device()));
}

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                     double label_smoothing, const std::string& reduction) {
  check_reduction("cross_entropy", reduction);
  TANDEM_CHECK(input.defined() && input.dim() >= 1, "cross_entropy: input must be [C], [N, C] or [N, C, d1, ...], got ",
               input.defined() ? input.str() : "undefined");
  TANDEM_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "cross_entropy: label_smoothing must be in [0, 1], got ",
               label_smoothing);
  const auto [class_dim, C, per_element, M] = class_layout("cross_entropy", input, weight);
  const bool probabilities = target.defined() && (target.dtype() == kFloat32 || target.dtype() == kFloat64);
  TANDEM_CHECK(target.defined() && (target.dtype() == kInt64 || probabilities),
               "cross_entropy: target must be int64 class indices or class probabilities of the input's shape, got ",
               target.defined() ? target.str() : "undefined");
  const Tensor lp = class_last(log_softmax(input, class_dim), M, C);
  if (probabilities) {
    TANDEM_CHECK(target.shape() == input.shape() && target.dtype() == input.dtype(),
                 "cross_entropy: class-probability target ", target.str(), " must have the input's shape and dtype ",
                 input.str());
    return cross_entropy_probabilities(lp, target, weight, label_smoothing, per_element, reduction);
  }
  TANDEM_CHECK(target.shape() == per_element, "cross_entropy: target ", target.str(), " does not match input ",
               input.str(), " (expected target shape ", shape_str(per_element), ")");
  if (label_smoothing == 0.0)
    return nll_loss_rows(lp, target.to(input.device()).reshape({M}), weight, ignore_index, reduction, per_element);

  // With label smoothing: the target pass (kernels::class_targets): the keep mask, safe (in-range)
  // gather indices, and the range check, which on CUDA is a deferred kernel error so the host never
  // waits here.
  const DType keep_dtype = input.dtype() == kFloat64 ? kFloat64 : kFloat32;  // low precision: log_softmax's f32
  const kernels::ClassTargets targets = kernels::class_targets(target.to(input.device()), C, ignore_index, keep_dtype);
  const Tensor& safe = targets.safe;
  // Each element's weight: w[target] where kept, 0 where ignored (1 and 0 without class weights).
  const Tensor kept_weight = weight.defined() ? mul(index_select(weight, 0, safe.reshape({M})), targets.keep) : targets.keep;

  const Tensor nll = mul(neg(reshape(gather(lp, 1, safe), {M})), kept_weight);
  const Tensor smooth = mul(neg(sum(weight.defined() ? mul(lp, weight) : lp, {1})), targets.keep);
  const Tensor loss = add(mul(nll, 1.0 - label_smoothing), mul(smooth, label_smoothing / static_cast<double>(C)));
  // The mean divides by the kept targets' weights (their count without class weights). With every
  // target ignored it is NaN (0 / 0) but the gradient is zero, as PyTorch's, so one batch of padding
  // cannot poison the weights.
  return reduce_loss(loss, target.shape(), reduction, kernels::sum_dims(kept_weight, {}, false));
}

Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     const std::string& reduction) {
  return cross_entropy(input, target, Tensor(), ignore_index, label_smoothing, reduction);
}

Tensor nll_loss(const Tensor& input_in, const Tensor& target, const Tensor& weight_in, int64_t ignore_index,
                const std::string& reduction) {
  check_reduction("nll_loss", reduction);
  TANDEM_CHECK(input_in.defined() && input_in.dim() >= 1,
               "nll_loss: input must be [C], [N, C] or [N, C, d1, ...] log-probabilities, got ",
               input_in.defined() ? input_in.str() : "undefined");
  const Tensor input = float32_if_half(input_in);
  const Tensor weight = weight_in.defined() ? float32_if_half(weight_in) : weight_in;
  const auto [class_dim, C, per_element, M] = class_layout("nll_loss", input, weight);
  TANDEM_CHECK(target.defined() && target.dtype() == kInt64 && target.shape() == per_element,
               "nll_loss: target must be int64 class indices of shape ", shape_str(per_element), " for input ",
               input_in.str(), ", got ", target.defined() ? target.str() : "undefined");
  return nll_loss_rows(class_last(input, M, C), target.to(input.device()).reshape({M}), weight, ignore_index,
                       reduction, per_element);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  check_reduction("mse_loss", reduction);
  TANDEM_CHECK(input.defined() && target.defined(), "mse_loss: input and target must be defined");
  views::broadcast_shapes(input.shape(), target.shape(), "mse_loss");
  const Tensor d = sub(input, target);
  const Tensor sq = mul(d, d);
  if (reduction == "none") return sq;
  return reduction == "sum" ? sum(sq) : mean(sq);
}

}  // namespace tandem::nn::functional
