// CheckInvalidLossHook: a NaN or infinite loss ends the run with one error naming the epoch and
// iteration, before any later hook (logger, checkpoint) sees the iteration, so no diverged weights
// are ever saved. Under fp16 loss scaling an inf/NaN is the scaler's business (it skips the step).
#include <cmath>

#include "train/hooks/builtin_hooks.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

class CheckInvalidLossHook : public Hook {
 public:
  std::string name() const override { return "CheckInvalidLossHook"; }
  int priority() const override { return kVeryHigh; }
  void after_train_iter(Runner& r, const IterOutputs& out) override {
    if (out.joined) return;  // no batch of its own: no loss
    const double v = out.loss;
    TANDEM_CHECK(std::isfinite(v) || r.scaler().enabled(), "the loss is ", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf",
                 " at epoch ", r.epoch(), ", iteration ", r.iter_in_epoch(), "/", r.iters_per_epoch(),
                 " (global iteration ", r.global_iter(), "): training diverged; lower optim_wrapper.optimizer.lr (--lr) or check the data");
  }
};

}  // namespace

std::shared_ptr<Hook> make_check_invalid_loss_hook(const Kwargs&) {
  return std::make_shared<CheckInvalidLossHook>();
}

}  // namespace tandem::train
