// Parameter schedulers of the Runner (MMEngine's param_scheduler): one interface over optim's
// learning-rate schedules, stepped by ParamSchedulerHook after every iteration (by_epoch false)
// or after every epoch (by_epoch true). state_dict is what a checkpoint keeps for an exact resume.
#pragma once

#include <map>
#include <memory>
#include <string>

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

// What a scheduler factory is given: the optimizer and the run's length.
struct ScheduleContext {
  optim::Optimizer* optimizer = nullptr;
  int64_t iters_per_epoch = 0;
  int64_t max_epochs = 0;
};

using SchedulerFactory = std::function<std::unique_ptr<ParamScheduler>(const ScheduleContext&, const Kwargs&)>;

// StepLR: kwargs step_size (1), gamma (0.1), by_epoch (true; false: step_size counts iterations).
std::unique_ptr<ParamScheduler> make_step_lr(const ScheduleContext& c, const Kwargs& k);
// CosineAnnealingLR: kwargs T_max (the whole run, in the unit of by_epoch), eta_min (0),
// by_epoch (false). With by_epoch true, T_max counts epochs and the lr still moves every
// iteration (MMEngine's convert_to_iter_based).
std::unique_ptr<ParamScheduler> make_cosine_lr(const ScheduleContext& c, const Kwargs& k);

}  // namespace tandem::train
