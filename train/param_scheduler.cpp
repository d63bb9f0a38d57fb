// The Runner's parameter schedulers (see param_scheduler.h): thin adapters over optim::StepLR and
// optim::CosineAnnealingLR.
#include "train/param_scheduler.h"

namespace tandem::train {
namespace {

class StepLRScheduler : public ParamScheduler {
 public:
  StepLRScheduler(optim::Optimizer& o, int64_t step_size, double gamma, bool by_epoch)
      : s_(o, step_size, gamma), by_epoch_(by_epoch) {}
  bool by_epoch() const override { return by_epoch_; }
  void step() override { s_.step(); }
  std::map<std::string, double> state_dict() const override { return s_.state_dict(); }
  void load_state_dict(const std::map<std::string, double>& state) override { s_.load_state_dict(state); }

 private:
  optim::StepLR s_;
  bool by_epoch_;
};

class CosineScheduler : public ParamScheduler {
 public:
  CosineScheduler(optim::Optimizer& o, int64_t t_max, double eta_min) : s_(o, t_max, eta_min) {}
  bool by_epoch() const override { return false; }  // moves every iteration
  void step() override { s_.step(); }
  std::map<std::string, double> state_dict() const override { return s_.state_dict(); }
  void load_state_dict(const std::map<std::string, double>& state) override { s_.load_state_dict(state); }

 private:
  optim::CosineAnnealingLR s_;
};

}  // namespace

std::unique_ptr<ParamScheduler> make_step_lr(const ScheduleContext& c, const Kwargs& k) {
  k.check_known({"step_size", "gamma", "by_epoch"});
  const int64_t step_size = k.integer("step_size", 1);
  const double gamma = k.number("gamma", 0.1);
  TANDEM_CHECK(step_size >= 1, k.owner(), ".step_size must be >= 1, got ", step_size);
  TANDEM_CHECK(gamma > 0, k.owner(), ".gamma must be > 0, got ", gamma);
  return std::make_unique<StepLRScheduler>(*c.optimizer, step_size, gamma, k.boolean("by_epoch", true));
}

std::unique_ptr<ParamScheduler> make_cosine_lr(const ScheduleContext& c, const Kwargs& k) {
  k.check_known({"T_max", "eta_min", "by_epoch"});
  const bool by_epoch = k.boolean("by_epoch", false);
  int64_t t_max = c.iters_per_epoch * c.max_epochs;
  if (k.has("T_max")) t_max = k.integer("T_max", 0) * (by_epoch ? c.iters_per_epoch : 1);
  TANDEM_CHECK(t_max >= 1, k.owner(), ".T_max must be >= 1, got ", t_max);
  return std::make_unique<CosineScheduler>(*c.optimizer, t_max, k.number("eta_min", 0.0));
}

}  // namespace tandem::train
