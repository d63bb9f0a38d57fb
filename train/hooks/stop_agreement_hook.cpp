// StopAgreementHook: after every iteration all ranks agree on a SIGTERM/SIGINT stop (the largest
// signal number any rank saw wins: one 1-element all-reduce on the host group, so a GPU job never
// waits for its device), so that every rank stops at the same iteration; CheckpointHook (lower
// priority, later) then saves, and the Runner ends the run. One process: the local signal.
#include "dist/group/host_values.h"
#include "train/hooks/builtin_hooks.h"
#include "train/runner.h"
#include "train/stop_signal.h"

namespace tandem::train {
namespace {

class StopAgreementHook : public Hook {
 public:
  std::string name() const override { return "StopAgreementHook"; }
  int priority() const override { return kLow + 5; }
  void after_train_iter(Runner& r, const IterOutputs&) override {
    const int local = StopSignal::requested();
    dist::ProcessGroup* group = r.host_group();
    r.set_stop(group ? static_cast<int>(dist::allreduce_values(*group, {static_cast<double>(local)},
                                                               dist::ReduceOp::Max, "the stop agreement")[0])
                     : local);
  }
};

}  // namespace

std::shared_ptr<Hook> make_stop_agreement_hook(const Kwargs&) {
  return std::make_shared<StopAgreementHook>();
}

}  // namespace tandem::train
