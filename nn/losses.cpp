// nn/losses.h, composed of differentiable ops (log_softmax, gather, sum, mul): the gradients follow
// from theirs. The target is checked and turned into a keep mask by kernels::class_targets on its
// device: a host target throws at once, a CUDA one reports through the deferred kernel-error record.
#include "nn/losses.h"

#include <limits>
#include <vector>

#include "core/view.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "nn/functional.h"

namespace tandem::nn::functional {
namespace {

void check_reduction(const char* op, const std::string& reduction) {
  TANDEM_CHECK(reduction == "mean" || reduction == "sum" || reduction == "none", op,
               ": reduction must be \"mean\", \"sum\" or \"none\", got \"", reduction, "\"");
}

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     const std::string& reduction) {
  check_reduction("cross_entropy", reduction);
  TANDEM_CHECK(input.defined() && input.dim() >= 1, "cross_entropy: input must be [C], [N, C] or [N, C, d1, ...], got ",
               input.defined() ? input.str() : "undefined");
  TANDEM_CHECK(target.defined() && target.dtype() == kInt64,
               "cross_entropy: target must be int64 class indices, got ", target.defined() ? target.str() : "undefined");
  TANDEM_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "cross_entropy: label_smoothing must be in [0, 1], got ",
               label_smoothing);
  const int64_t class_dim = input.dim() == 1 ? 0 : 1;
  const int64_t C = input.shape()[class_dim];
  Shape expected = input.shape();
  expected.erase(expected.begin() + class_dim);
  TANDEM_CHECK(target.shape() == expected, "cross_entropy: target ", target.str(), " does not match input ",
               input.str(), " (expected target shape ", shape_str(expected), ")");

  // The target pass (kernels::class_targets): the keep mask, safe (in-range) gather indices, and
  // the range check, which on CUDA is a deferred kernel error so the host never waits here.
  const int64_t M = target.numel();
  const DType keep_dtype = input.dtype() == kFloat64 ? kFloat64 : kFloat32;  // low precision: log_softmax's f32
  const kernels::ClassTargets targets = kernels::class_targets(target.to(input.device()), C, ignore_index, keep_dtype);
  const Tensor& keep = targets.keep;
  const Tensor& safe = targets.safe;

  // Log-probabilities as [M, C], the class dimension last.
  Tensor lp = log_softmax(input, class_dim);
  if (input.dim() == 1) {
    lp = unsqueeze(lp, 0);
  } else if (input.dim() > 2) {
    std::vector<int64_t> perm{0};
    for (int64_t d = 2; d < input.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    lp = permute(lp, perm);
  }
  lp = reshape(lp, {M, C});

  Tensor loss = mul(neg(reshape(gather(lp, 1, safe), {M})), keep);
  if (label_smoothing > 0.0) {
    const Tensor smooth = mul(neg(sum(lp, {1})), keep);
    loss = add(mul(loss, 1.0 - label_smoothing), mul(smooth, label_smoothing / static_cast<double>(C)));
  }
  if (reduction == "none") return reshape(loss, target.shape());
  if (reduction == "sum") return sum(loss);
  // The mean over the kept targets: their count is read on the host only when it lives there. With
  // every target ignored the mean is NaN (0 / 0) but the gradient is zero, as PyTorch's: the
  // division is by max(count, 1), whose gradient reaches no kept row, and the NaN is added as a
  // constant (no gradient), so one batch of padding cannot poison the weights.
  if (keep.device().is_cpu()) {
    const Tensor kept = kernels::sum(keep);
    const double k = kept.dtype() == kFloat64 ? kept.item<double>() : kept.item<float>();
    if (k == 0) return add(sum(loss), std::numeric_limits<double>::quiet_NaN());
    return div(sum(loss), k);
  }
  const Tensor kept = kernels::sum(keep);
  const Tensor none_kept = eq(kept, 0.0).to(kept.dtype());  // 1 when nothing is kept, else 0
  const Tensor nan_if_none = sub(div(kept, kept), 1.0);      // kept / kept: 1, or NaN for 0 / 0
  return add(div(sum(loss), add(kept, none_kept)), nan_if_none);
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
