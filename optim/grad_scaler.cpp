// GradScaler (see optim/grad_scaler.h). step() unscales every gradient with one fused kernel per
// tensor into one found_inf flag per device, then reads each flag once (the only host wait); the
// optimizer runs only if all flags are clear, as torch.cuda.amp.GradScaler.step does.
#include "optim/grad_scaler.h"

#include <cmath>

#include "core/autograd.h"
#include "kernels/amp.h"
#include "kernels/pointwise.h"

namespace tandem::optim {
namespace {

// The loss times the scale, differentiable: backward multiplies the incoming gradient by the same
// scale (optim sits beside nn, not above it, so it records its own node).
struct LossScaleBackward final : Node {
  double scale = 1.0;
  std::string name() const override { return "LossScaleBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::binary(kernels::BinaryOp::Mul, g[0], scale)};
  }
};

}  // namespace

GradScaler::GradScaler(GradScalerOptions o) : options_(o), scale_(static_cast<float>(o.init_scale)) {
  TANDEM_CHECK(o.init_scale > 0 && std::isfinite(scale_), "GradScaler: init_scale must be positive and "
               "finite in float32, got ", o.init_scale);
  TANDEM_CHECK(o.growth_factor > 1.0, "GradScaler: growth_factor must be > 1, got ", o.growth_factor);
  TANDEM_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0,
               "GradScaler: backoff_factor must be in (0, 1), got ", o.backoff_factor);
  TANDEM_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", o.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  Tensor scaled = kernels::binary(kernels::BinaryOp::Mul, loss, scale_);
  if (autograd::any_requires_grad({loss})) {
    auto node = std::make_shared<LossScaleBackward>();
    node->scale = scale_;
    autograd::record(node, {loss}, {&scaled});
  }
  return scaled;
}

void GradScaler::unscale(Optimizer& opt) {
  if (!options_.enabled) return;
  TANDEM_CHECK(!unscaled_, "GradScaler::unscale: already called since the last step()");
  const double inv_scale = 1.0 / scale_;
  std::vector<Tensor> flags;  // one per device met, in order of first use
  for (size_t gi = 0; gi < opt.param_groups().size(); ++gi)
    for (size_t pi = 0; pi < opt.param_groups()[gi].params.size(); ++pi) {
      Tensor g = opt.param_groups()[gi].params[pi].grad();
      if (!g.defined()) continue;
      TANDEM_CHECK(g.dtype() == kFloat32, "GradScaler::step: gradients must be float32 (keep master weights in "
                   "float32 and run the forward under AutocastGuard), got ", g.str(), " for parameter ", pi,
                   " of param group ", gi);
      Tensor* flag = nullptr;
      for (Tensor& f : flags)
        if (f.device() == g.device()) flag = &f;
      if (!flag) {
        flags.push_back(Tensor::zeros({1}, kFloat32, g.device()));
        flag = &flags.back();
      }
      if (!g.is_contiguous()) {
        Tensor c = g.contiguous();
        kernels::unscale_and_check_(c, *flag, inv_scale);
        g.copy_(c);
      } else {
        kernels::unscale_and_check_(g, *flag, inv_scale);
      }
    }
  found_inf_ = false;
  for (const Tensor& f : flags) found_inf_ = found_inf_ || f.item<float>() != 0.0f;
  unscaled_ = true;
}

bool GradScaler::step(Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  if (!unscaled_) unscale(opt);
  unscaled_ = false;
  stepped_since_update_ = true;
  if (found_inf_) return false;
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled || !stepped_since_update_) return;
  stepped_since_update_ = false;
  // As torch._amp_update_scale_: the products in double, stored as float32.
  if (found_inf_) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    const float grown = static_cast<float>(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;  // as PyTorch: never grow to inf
    growth_tracker_ = 0;
  }
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  const float s = static_cast<float>(new_scale);
  TANDEM_CHECK(new_scale > 0 && std::isfinite(s), "GradScaler::update: new_scale must be positive and finite in "
               "float32, got ", new_scale);
  scale_ = s;
  // As PyTorch: the iteration's inf checks are dropped, the growth tracker is kept.
  found_inf_ = false;
  stepped_since_update_ = false;
}

void GradScaler::update(const Tensor& new_scale) {
  TANDEM_CHECK(new_scale.defined() && new_scale.numel() == 1 && is_floating(new_scale.dtype()) &&
                   !new_scale.requires_grad(),
               "GradScaler::update: new_scale must be a float or a one-element floating tensor with "
               "requires_grad false, got ", new_scale.defined() ? new_scale.str() : std::string("an undefined tensor"));
  update(new_scale.item<double>());
}

std::map<std::string, Tensor> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", Tensor::scalar(scale_, kFloat64)},
          {"growth_tracker", Tensor::scalar(static_cast<double>(growth_tracker_), kInt64)}};
}

void GradScaler::load_state_dict(const std::map<std::string, Tensor>& state) {
  if (!options_.enabled) {
    TANDEM_CHECK(state.empty(), "GradScaler::load_state_dict: this scaler is disabled but the state holds ",
                 state.size(), " entries (saved with mixed precision on?); enable the scaler to load it");
    return;
  }
  auto get = [&](const char* key) -> const Tensor& {
    auto it = state.find(key);
    TANDEM_CHECK(it != state.end(), "GradScaler::load_state_dict: missing key '", key,
                 "' (expected 'scale' and 'growth_tracker')");
    TANDEM_CHECK(it->second.numel() == 1, "GradScaler::load_state_dict: '", key,
                 "' must hold one value, got ", it->second.str());
    return it->second;
  };
  const double s = get("scale").item<double>();
  const double tracker = get("growth_tracker").item<double>();
  TANDEM_CHECK(s > 0 && std::isfinite(static_cast<float>(s)), "GradScaler::load_state_dict: scale must be "
               "positive and finite, got ", s);
  TANDEM_CHECK(tracker >= 0, "GradScaler::load_state_dict: growth_tracker must be >= 0, got ", tracker);
  scale_ = static_cast<float>(s);
  growth_tracker_ = static_cast<int64_t>(tracker);
  found_inf_ = false;
  stepped_since_update_ = false;
  unscaled_ = false;
}

}  // namespace tandem::optim
