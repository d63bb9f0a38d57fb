// Parameter schedulers of the Runner, as MMEngine's (mmengine/optim/scheduler): each changes the
// optimizer's learning rate in the chainable form (from the lr it finds), only while its step count
// is inside [begin, end). The Runner holds a list (MMEngine's param_scheduler as a list), and
// ParamSchedulerHook steps, in list order, the iteration-based ones after every iteration and the
// epoch-based ones after every epoch; composing them is applying each active one in turn, e.g. a
// LinearLR warm-up over the first 500 iterations, then MultiStepLR by epoch.
//
// A scheduler applies its first value when it is built (MMEngine's constructor step), so a list
// built in order starts with every active scheduler applied once, in order. state_dict holds the
// step counters (and the constants, checked on load); the lr itself is the optimizer's state, so a
// resume restores both and continues bit for bit.
//
// Common keyword arguments: by_epoch (true), begin (0), end (the whole run: max_epochs, or every
// iteration of the run with by_epoch false), convert_to_iter_based (false; with by_epoch true:
// begin, end and the scheduler's periods become iterations and it steps every iteration).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "train/registry.h"

namespace tandem::train {

class ParamScheduler {
 public:
  virtual ~ParamScheduler() = default;
  virtual bool by_epoch() const = 0;
  virtual void step() = 0;
  virtual std::map<std::string, double> state_dict() const = 0;
  virtual void load_state_dict(const std::map<std::string, double>& state) = 0;
};

// What a scheduler factory is given: the optimizer, the run's length, and the lrs the optimizer
// had before any scheduler (MMEngine's initial_lr; empty: the optimizer's current ones).
struct ScheduleContext {
  optim::Optimizer* optimizer = nullptr;
  int64_t iters_per_epoch = 0;
  int64_t max_epochs = 0;
  std::vector<double> initial_lrs;
};

using SchedulerFactory = std::function<std::unique_ptr<ParamScheduler>(const ScheduleContext&, const Kwargs&)>;

// One entry of param_scheduler: a registered type and its keyword arguments.
struct SchedulerSpec {
  std::string type;
  Kwargs args;
};

// The Runner's schedulers, in config order.
class SchedulerList {
 public:
  void add(std::unique_ptr<ParamScheduler> s) { items_.push_back(std::move(s)); }
  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }
  ParamScheduler& at(size_t i) { return *items_.at(i); }
  void step_iter();   // every scheduler with by_epoch false, in order
  void step_epoch();  // every scheduler with by_epoch true, in order
  // "<i>.<key>" for scheduler i's state; load throws naming a missing or surplus scheduler.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  std::vector<std::unique_ptr<ParamScheduler>> items_;
};

// MMEngine's lr schedulers (the common keyword arguments above, plus):
//   StepLR             step_size (1), gamma (0.1): lr *= gamma every step_size steps
//   MultiStepLR        milestones (required, a list), gamma (0.1): lr *= gamma at each milestone
//   LinearLR           start_factor (1/3), end_factor (1.0): from lr x start to lr x end over [begin, end)
//   ConstantLR         factor (1/3): lr x factor until end - 1, then the lr again
//   ExponentialLR      gamma (required): lr *= gamma every step (gamma^(1/iters) per iteration
//                      when converted)
//   CosineAnnealingLR  T_max (end - begin), eta_min (0) or eta_min_ratio (of the initial lr)
// registered in `reg` (param_schedulers() calls it when it is first used) with their keyword schemas.
void register_lr_schedulers(Registry<SchedulerFactory>& reg);

}  // namespace tandem::train
