// MMEngine's optimizer wrappers (mmengine/optim/optimizer/optimizer_wrapper.py and
// amp_optimizer_wrapper.py), registered by name in optim_wrappers() with their keyword schemas:
//   OptimWrapper     accumulative_counts (1), clip_grad (null or dict(max_norm, norm_type=2))
//   AmpOptimWrapper  the same, plus dtype ('float16' | 'bfloat16'; null: by device, decided by the
//                    Runner before it builds the wrapper) and loss_scale, as MMEngine's: 'dynamic'
//                    (a GradScaler with PyTorch's defaults), a positive number (a static scale:
//                    GradScaler(init_scale=loss_scale) and update(new_scale=loss_scale) after every
//                    step, so the scale stays put while steps with inf/NaN gradients are still
//                    skipped) or a dict of GradScaler's keywords (init_scale, growth_factor,
//                    backoff_factor, growth_interval, enabled). Only float16 is scaled: bfloat16
//                    has float32's range, its scaler is off whatever loss_scale says.
// A factory is given the optimizer (built from optim_wrapper.optimizer) and the other keywords.
//
// The update, as MMEngine's update_params over a whole run (inner_count = backward passes so far,
// max_counts = the run's iterations): the loss is divided by accumulative_counts N, or by
// max_counts % N in the last, short group (scale_loss); gradients are synchronised only by the
// backward that ends a group or the run (should_sync, for a wrapper's no_sync); after that backward
// the step is due (should_update): clipping (after AMP unscaling) on the final gradients, then the
// scaler's or the optimizer's step, then zero_grad when gradients were accumulated.
//
// OptimWrapperDict: several named wrappers for a model with several optimizers, whose own
// train_step (train/model.h) updates each: MMEngine's optim_wrapper=dict(
// constructor='MultiOptimWrapperConstructor', gen=dict(type='OptimWrapper', optimizer=...),
// disc=dict(...)), each name a child module of the model whose parameters that optimizer owns
// (docs/training.md, docs/embedding.md).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/amp.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "train/registry.h"

namespace tandem::train {

// AmpOptimWrapper's loss_scale: the GradScaler's options, and static_scale > 0 for a number.
struct LossScale {
  optim::GradScalerOptions scaler;
  double static_scale = 0;  // > 0: update(new_scale=static_scale) after every step
};
// loss_scale given as JSON text: "\"dynamic\"", a positive number or a dict of GradScaler's
// keywords (grad_scaler_schema()). Errors are one line naming the config key `path`
// ("optim_wrapper.loss_scale").
LossScale parse_loss_scale(const std::string& json_text, const std::string& path);
// GradScaler's keywords with PyTorch's defaults, for loss_scale's dict form.
Schema grad_scaler_schema();

struct OptimWrapperOptions {
  int64_t accumulative_counts = 1;
  double clip_max_norm = 0.0;  // 0: no clipping
  double clip_norm_type = 2.0;
  amp::Precision precision = amp::Precision::kOff;  // AmpOptimWrapper's dtype (kOff: OptimWrapper)
  LossScale loss_scale;                             // used with float16
};

class OptimWrapper {
 public:
  OptimWrapper(std::unique_ptr<optim::Optimizer> optimizer, OptimWrapperOptions options);
  optim::Optimizer& optimizer() { return *optimizer_; }
  optim::GradScaler& scaler() { return *scaler_; }
  const OptimWrapperOptions& options() const { return o_; }
  // Replaces the clipping over the optimizer's parameters (e.g. FSDP's, whose norm needs every
  // rank's shards): f(max_norm, norm_type) clips and returns the total norm before clipping.
  void set_clip(std::function<double(double, double)> f) { clip_ = std::move(f); }

  // MMEngine's initialize_count_status: `done` backward passes so far of a run of `max_counts`.
  void initialize_count_status(int64_t done, int64_t max_counts);
  int64_t inner_count() const { return inner_count_; }
  bool should_sync() const;    // the next backward all-reduces (it ends a group or the run)
  bool should_update() const;  // after a backward: the step is due
  Tensor scale_loss(const Tensor& loss) const;  // / N, or / (max_counts % N) in the last group
  void backward(const Tensor& loss);            // through the loss scaler; counts one pass
  void count_pass() { ++inner_count_; }         // a pass without a backward of its own (Join)
  // Clipping (when on) and the step; returns the norm before clipping, or -1 when not clipped.
  double step();
  void zero_grad(bool set_to_none) { optimizer_->zero_grad(set_to_none); }
  // MMEngine's update_params: backward(scale_loss(loss)), then, when should_update(), step() and
  // zero_grad(). Returns whether it stepped.
  bool update_params(const Tensor& loss);

 private:
  std::unique_ptr<optim::Optimizer> optimizer_;
  OptimWrapperOptions o_;
  std::unique_ptr<optim::GradScaler> scaler_;
  std::function<double(double, double)> clip_;
  int64_t inner_count_ = 0, max_counts_ = 0;
};

using OptimWrapperFactory =
    std::function<std::unique_ptr<OptimWrapper>(std::unique_ptr<optim::Optimizer>, const Kwargs&)>;
// OptimWrapper and AmpOptimWrapper (see above); an embedding program may add its own.
Registry<OptimWrapperFactory>& optim_wrappers();
// clip_grad's keys: max_norm (required, > 0), norm_type (2).
Schema clip_grad_schema();

class OptimWrapperDict {
 public:
  void add(const std::string& name, std::unique_ptr<OptimWrapper> w);
  OptimWrapper& at(const std::string& name);  // an unknown name throws naming the known ones
  std::vector<std::string> names() const;
  size_t size() const { return items_.size(); }
  OptimWrapper& first() {  // the first by name (the log's lr)
    TANDEM_CHECK(!items_.empty(), "optim_wrapper: the OptimWrapperDict is empty");
    return *items_.begin()->second;
  }

 private:
  std::map<std::string, std::unique_ptr<OptimWrapper>> items_;
};

// Each entry of `config` (name -> dict(type=..., optimizer=dict(type=..., ...), ...)) built through
// optim_wrappers() over `params_of(name)`, its optimizer through optimizers(); errors name
// "optim_wrapper.<name>".
OptimWrapperDict build_optim_wrapper_dict(const std::map<std::string, std::string>& config_json,
                                          const std::function<std::vector<Tensor>(const std::string&)>& params_of);

}  // namespace tandem::train
