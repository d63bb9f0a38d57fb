// DistSamplerSeedHook: before each epoch, sets the training sampler's epoch (0-based), so that a
// shuffling sampler draws a new order every epoch from (seed, epoch), the same on every rank and in a
// resumed run.
#include "train/hooks/builtin_hooks.h"
#include "train/runner.h"

namespace tandem::train {
namespace {

class DistSamplerSeedHook : public Hook {
 public:
  std::string name() const override { return "DistSamplerSeedHook"; }
  int priority() const override { return kNormal; }
  void before_train_epoch(Runner& r) override { r.set_sampler_epoch(r.epoch() - 1); }
};

}  // namespace

std::shared_ptr<Hook> make_dist_sampler_seed_hook(const Kwargs&) {
  return std::make_shared<DistSamplerSeedHook>();
}

}  // namespace tandem::train
