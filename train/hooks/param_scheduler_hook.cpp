// ParamSchedulerHook: steps the Runner's schedulers, in order: the iteration-based ones after every
// iteration, the epoch-based ones after every epoch, after the logger read the lr the iteration used.
#include "train/hooks/builtin_hooks.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

class ParamSchedulerHook : public Hook {
 public:
  std::string name() const override { return "ParamSchedulerHook"; }
  int priority() const override { return kLow; }
  void after_train_iter(Runner& r, const IterOutputs&) override { r.schedulers().step_iter(); }
  void after_train_epoch(Runner& r) override { r.schedulers().step_epoch(); }
};

}  // namespace

std::shared_ptr<Hook> make_param_scheduler_hook(const Kwargs&) {
  return std::make_shared<ParamSchedulerHook>();
}

}  // namespace tandem::train
