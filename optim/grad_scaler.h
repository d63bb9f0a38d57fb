// Dynamic loss scaling for mixed-precision training, as torch.cuda.amp.GradScaler.
// Owns: the scale, the growth tracker, and the unscale/skip/update policy.
// Assumes: gradients are f32 (the master weights are f32 under autocast); one
//   scale()/backward()/step()/update() sequence per iteration, on one thread.
// Guarantees: step() unscales every gradient in place (grad *= 1/scale); if any
//   gradient holds inf or NaN the optimizer step is skipped and step() returns
//   false. update() multiplies the scale by backoff_factor after a skipped step and
//   by growth_factor after growth_interval consecutive clean steps; update(new_scale)
//   sets the scale instead (PyTorch's update(new_scale=...): the growth tracker is left
//   as it is). The scale is a float32 value, as PyTorch's scale tensor. Disabled: every
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
  // PyTorch's update(new_scale=...): the scale becomes new_scale (rounded to float32, positive and
  // finite); the growth tracker is not changed and no step is needed before it. The tensor form
  // takes a one-element floating tensor that does not require grad.
  void update(double new_scale);
  void update(const Tensor& new_scale);
  double get_scale() const { return scale_; }
  bool enabled() const { return options_.enabled; }
  int64_t growth_tracker() const { return growth_tracker_; }

  // "scale", "growth_tracker" (scalar tensors), as PyTorch's state_dict keys.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state);

 private:
  GradScalerOptions options_;
  float scale_;  // float32, as PyTorch's scale tensor
  int64_t growth_tracker_ = 0;
  bool found_inf_ = false;     // result of the last step()
  bool stepped_since_update_ = false;
  bool unscaled_ = false;  // unscale() ran since the last step()
};

}  // namespace tandem::optim
