// Join: training on uneven inputs, as torch.distributed.algorithms.Join does for DDP. Ranks may
// have different numbers of batches; a rank that runs out calls join(), which shadows the
// collectives of the ranks still training (each of their DDP forwards first tells the joined
// ranks what the iteration will do: whether gradients are reduced, whether buffers are
// broadcast and from which rank; the joined rank then takes part in the same collectives with
// zero gradients) until every rank has joined. After each shadowed synchronised backward the
// joined rank's .grad holds the same average as everyone's, and join()'s callback runs, so it can
// take the same optimizer step (the trainer does: parameters and optimizer state then stay equal
// on every rank). At the end the model of the highest rank among the last to join is broadcast
// to all, so every replica ends equal in any case.
//
// Gradients are still divided by the whole world size (PyTorch's default,
// divide_by_initial_world_size=True): a joined rank contributes zeros.
// throw_on_early_termination: the first rank to run out makes every rank throw at its next DDP
// forward (and itself throws), instead of shadowing.
//
// While a Join is alive, every DDP forward costs one small all-reduce more. Collectives outside
// DDP (a trainer's loss averaging, a stop agreement, ZeroRedundancyOptimizer's step) are not
// shadowed: run them after join() on every rank, or not at all, while ranks differ in batches.
// Threads: the training thread.
#pragma once

#include <functional>

#include "dist/parallel/ddp.h"

namespace tandem::dist {

class Join {
 public:
  explicit Join(DistributedDataParallel& ddp, bool throw_on_early_termination = false);
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // Call once this rank has no more batches. Returns when every rank has joined and the final
  // model is in place. Counts the other ranks' iterations shadowed here. after_each(synced) runs
  // after each shadowed iteration (synced: gradients were reduced, and .grad holds them); it may
  // run collectives of its own if every training rank runs them after each iteration too.
  int64_t join(const std::function<void(bool synced)>& after_each = {});
  int64_t shadowed_iterations() const { return shadowed_; }

 private:
  DistributedDataParallel& ddp_;
  bool throw_on_early_termination_;
  bool joined_ = false;
  int64_t shadowed_ = 0;
};

}  // namespace tandem::dist
