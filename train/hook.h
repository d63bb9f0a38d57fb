// Hooks of the Runner, as MMEngine's (mmengine/hooks/hook.py): named call points around the run,
// each training epoch and iteration, and each validation. The Runner calls every hook at each
// point in ascending priority (MMEngine's numbers: VERY_HIGH 10 ... NORMAL 50 ... VERY_LOW 90;
// equal priorities keep registration order). A hook reads and changes the run through the Runner
// (train/runner.h). Hooks run on the training thread; a throw ends the run with that error.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::train {

class Runner;
struct Checkpoint;

enum Priority : int {
  kHighest = 0,
  kVeryHigh = 10,
  kHigh = 30,
  kAboveNormal = 40,
  kNormal = 50,
  kBelowNormal = 60,
  kLow = 70,
  kVeryLow = 90,
  kLowest = 100,
};

// What one training iteration did.
struct IterOutputs {
  double loss = 0;          // the batch's mean loss, before any division for accumulation
  double lr = 0;            // the learning rate this iteration used
  int64_t batch_size = 0;   // samples in this rank's batch
  bool updated = false;     // the optimizer stepped (false inside an accumulation group)
  double grad_norm = -1;    // total gradient norm before clipping; -1 when not clipped
  bool joined = false;      // this rank ran out of batches (pad false) and shadowed the others' iteration
  std::vector<int64_t> indices;  // the dataset indices of this rank's batch (empty when joined)
  // The model's named losses (their sum is `loss`); empty when joined.
  std::vector<std::pair<std::string, double>> losses;
};

// What one validation pass measured (summed over every rank's shard): every metric's named values
// (train/evaluator.h), and for the common ones their fields (0 when no metric gives them).
struct ValMetrics {
  double loss = 0, accuracy = 0;    // "loss", "accuracy/top1"
  int64_t correct = 0, total = 0;   // top-1 hits and samples
  std::vector<std::pair<std::string, double>> values;
  // The value named `name` ("accuracy" is "accuracy/top1"); null when no metric gives it.
  const double* find(const std::string& name) const {
    const std::string key = name == "accuracy" ? "accuracy/top1" : name;
    for (const auto& [k, v] : values)
      if (k == key) return &v;
    return nullptr;
  }
};

class Hook {
 public:
  virtual ~Hook() = default;
  virtual std::string name() const = 0;
  virtual int priority() const { return kNormal; }

  virtual void before_run(Runner&) {}
  virtual void after_run(Runner&) {}
  virtual void before_train_epoch(Runner&) {}
  virtual void after_train_epoch(Runner&) {}
  virtual void before_train_iter(Runner&) {}
  virtual void after_train_iter(Runner&, const IterOutputs&) {}
  virtual void before_val_epoch(Runner&) {}
  virtual void after_val_epoch(Runner&, const ValMetrics&) {}
  // A checkpoint is about to be written (rank 0): a hook adds its state to Checkpoint::extra.
  virtual void before_save_checkpoint(Runner&, Checkpoint&) {}
  // Under FSDP, on every rank, before that (saving is collective there): a hook whose state is
  // sharded gathers it into Checkpoint::extra (rank 0's checkpoint is the one written).
  virtual void gather_for_checkpoint(Runner&, Checkpoint&) {}
  // A resume has restored the checkpoint's weights, optimizer, schedule and position.
  virtual void after_load_checkpoint(Runner&, const Checkpoint&) {}
};

}  // namespace tandem::train
