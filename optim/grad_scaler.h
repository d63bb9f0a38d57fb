// Dynamic loss scaling for mixed-precision training, as torch.cuda.amp.GradScaler.
// Owns: the scale, the growth tracker, and the unscale/skip/update policy.
// Assumes: gradients are f32 (the master weights are f32 under autocast); one
//   scale()/backward()/step()/update() sequence per iteration, on one thread.
// Guarantees: step() unscales every gradient in place (grad *= 1/scale); if any
//   gradient holds inf or NaN the optimizer step is skipped and step() returns
//   false. update() multiplies the scale by backoff_factor after a skipped step and
//   by growth_factor after growth_interval consecutive clean steps. Disabled: every
//   call is a pass-through (scale() returns the loss, step() always steps).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace tandem::optim {

struct GradScalerOptions {
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions o = {});
  Tensor scale(const Tensor& loss) const;  // loss * scale (differentiable); identity when disabled
  // Unscales the gradients in place (grad *= 1/scale) and records whether any is inf/NaN, as
  // torch.cuda.amp.GradScaler.unscale_: call it before clipping; step() then does not unscale again.
  void unscale(Optimizer& opt);
  bool step(Optimizer& opt);  // unscale grads in place (unless unscale() ran); skip opt.step() on inf/NaN
  void update();              // back off after a skip, grow after growth_interval clean steps
  double get_scale() const { return scale_; }
  bool enabled() const { return options_.enabled; }
  int64_t growth_tracker() const { return growth_tracker_; }

  // "scale", "growth_tracker" (scalar tensors), as PyTorch's state_dict keys.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool found_inf_ = false;     // result of the last step()
  bool stepped_since_update_ = false;
  bool unscaled_ = false;  // unscale() ran since the last step()
};

}  // namespace tandem::optim
