// MMEngine's ExponentialMovingAverage (mmengine/model/averaged_model.py) over a model's named
// tensors, the arithmetic of EMAHook (ema_hook.cpp):
//   update number 0                    averaged = a copy of the source
//   every `interval`-th update after   averaged += momentum * (source - averaged)   (torch's lerp_)
// for floating tensors; other tensors (integer buffers) keep their first copy. Every update counts
// in steps(), as MMEngine's `steps` buffer.
#pragma once

#include <cstdint>

#include "core/safetensors.h"
#include "nn/module.h"

namespace tandem::train {

class ExponentialMovingAverage {
 public:
  explicit ExponentialMovingAverage(double momentum, int64_t interval = 1);
  // Starts over from copies of `source` (detached, on its device), steps 0.
  void reset(const nn::NamedTensors& source);
  bool empty() const { return averaged_.empty(); }
  void update(const nn::NamedTensors& source);
  // Sets every averaged tensor to the source's value (before EMAHook's begin_iter); steps unchanged.
  void copy_from(const nn::NamedTensors& source);
  // Exchanges the averaged values with the source's, in place (the model runs with the averages).
  void swap_with(const nn::NamedTensors& source);
  const nn::NamedTensors& averaged() const { return averaged_; }
  int64_t steps() const { return steps_; }
  // "<prefix>module.<name>" for each tensor and "<prefix>steps" (MMEngine's ema_state_dict names).
  void save(TensorMap& out, const std::string& prefix) const;
  // Reads what save wrote into the tensors reset() made; throws naming a missing or misshapen one.
  void load(const TensorMap& in, const std::string& prefix);

 private:
  void check_matches(const nn::NamedTensors& source) const;
  double momentum_;
  int64_t interval_, steps_ = 0;
  nn::NamedTensors averaged_;
};

}  // namespace tandem::train
