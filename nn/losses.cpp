// nn/losses.h, composed of differentiable ops (log_softmax, gather, sum, mul): the gradients follow
// from theirs. The target is read on the host once to check it and build the keep mask.
#include "nn/losses.h"

#include <vector>

#include "core/view.h"
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

  // Host pass over the target: validity, the keep mask, and safe (in-range) gather indices.
  const int64_t M = target.numel();
  const std::vector<int64_t> t = target.to_vector<int64_t>();
  const DType keep_dtype = input.dtype() == kFloat64 ? kFloat64 : kFloat32;  // low precision: log_softmax's f32
  Tensor keep = Tensor::empty({M}, keep_dtype);
  Tensor safe = Tensor::empty({M, 1}, kInt64);
  int64_t kept = 0;
  for (int64_t i = 0; i < M; ++i) {
    const bool ignored = t[i] == ignore_index;
    TANDEM_CHECK(ignored || (t[i] >= 0 && t[i] < C), "cross_entropy: target ", t[i], " at position ", i,
                 " is out of range for ", C, " classes (expected 0 <= target < ", C, " or ignore_index ",
                 ignore_index, ")");
    if (keep_dtype == kFloat64) {
      keep.data<double>()[i] = ignored ? 0.0 : 1.0;
    } else {
      keep.data<float>()[i] = ignored ? 0.0f : 1.0f;
    }
    safe.data<int64_t>()[i] = ignored ? 0 : t[i];
    kept += ignored ? 0 : 1;
  }

  keep = keep.to(input.device());
  safe = safe.to(input.device());

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
  return div(sum(loss), static_cast<double>(kept));
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
