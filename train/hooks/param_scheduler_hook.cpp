// ParamSchedulerHook: steps the Runner's scheduler after every iteration (by_epoch false) or after
// every epoch (by_epoch true), after the logger read the lr the iteration used.
#include "train/hooks/builtin_hooks.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

class ParamSchedulerHook : public Hook {
 public:
  std::string name() const override { return "ParamSchedulerHook"; }
  int priority() const override { return kLow; }
  void after_train_iter(Runner& r, const IterOutputs&) override {
    if (ParamScheduler* s = r.scheduler(); s && !s->by_epoch()) s->step();
  }
  void after_train_epoch(Runner& r) override {
    if (ParamScheduler* s = r.scheduler(); s && s->by_epoch()) s->step();
  }
};

}  // namespace

std::shared_ptr<Hook> make_param_scheduler_hook(const Kwargs& k) {
  k.check_known({});
  return std::make_shared<ParamSchedulerHook>();
}

}  // namespace tandem::train
