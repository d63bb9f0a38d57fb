// clip_grad_norm_ (see clip_grad.h). The 2-norm is summed on the gradients' device (one host read
// per device); other norms read the gradients to the host and accumulate in double.
#include "optim/clip_grad.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/elementwise.h"

namespace tandem::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  TANDEM_CHECK(max_norm > 0, "clip_grad: max_norm must be > 0, got ", max_norm);
  TANDEM_CHECK(norm_type >= 1 || std::isinf(norm_type), "clip_grad: norm_type must be >= 1 or inf, got ", norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  double total = 0.0;
  if (norm_type == 2.0) {
    for (const Tensor& g : grads) total += kernels::sum(kernels::mul(g, g)).item<double>();
    total = std::sqrt(total);
  } else {
    const bool inf = std::isinf(norm_type);
    for (const Tensor& g : grads)
      for (float v : g.to(Device::cpu()).contiguous().to_vector<float>()) {
        const double a = std::fabs(static_cast<double>(v));
        total = inf ? std::max(total, a) : total + std::pow(a, norm_type);
      }
    if (!inf) total = std::pow(total, 1.0 / norm_type);
  }
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  // PyTorch multiplies even when the coefficient is 1 (a no-op in float32 arithmetic); skip that.
  if (coef < 1.0)
    for (Tensor& g : grads) g.copy_(kernels::scale(g, static_cast<double>(static_cast<float>(coef))));
  return total;
}

}  // namespace tandem::optim
