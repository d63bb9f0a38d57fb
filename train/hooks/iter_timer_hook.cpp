// IterTimerHook: the wall time spent waiting for each batch (data_time) and the whole iteration
// (time), handed to the Runner for the logger.
#include <chrono>

#include "train/hooks/builtin_hooks.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

using Clock = std::chrono::steady_clock;

class IterTimerHook : public Hook {
 public:
  std::string name() const override { return "IterTimerHook"; }
  int priority() const override { return kNormal; }
  void before_train_epoch(Runner&) override { tick_ = Clock::now(); }
  void before_train_iter(Runner&) override { data_time_ = seconds_since(tick_); }
  void after_train_iter(Runner& r, const IterOutputs&) override {
    r.set_times(data_time_, seconds_since(tick_));
    tick_ = Clock::now();
  }

 private:
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
  Clock::time_point tick_ = Clock::now();
  double data_time_ = 0;
};

}  // namespace

std::shared_ptr<Hook> make_iter_timer_hook(const Kwargs&) {
  return std::make_shared<IterTimerHook>();
}

}  // namespace tandem::train
