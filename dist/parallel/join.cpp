#include "dist/parallel/join.h"

#include "dist/group/host_values.h"

namespace tandem::dist {

Join::Join(DistributedDataParallel& ddp, bool throw_on_early_termination)
    : ddp_(ddp), throw_on_early_termination_(throw_on_early_termination) {
  ddp_.join_enabled_ = true;
}

Join::~Join() { ddp_.join_enabled_ = false; }

int64_t Join::join(const std::function<void(bool synced)>& after_each) {
  TANDEM_CHECK(!joined_, "Join: join() was already called on this rank");
  joined_ = true;
  ProcessGroup& group = *ddp_.group_;
  bool last_joiner = true;
  for (;;) {
    const auto notice = ddp_.exchange_join_notice(/*joined=*/true, /*terminate=*/throw_on_early_termination_);
    if (notice.active == 0) break;
    if (throw_on_early_termination_)
      TANDEM_FAIL("Join: rank ", group.rank(), " ran out of inputs while ", notice.active,
                  " rank(s) were still training; throw_on_early_termination stops every rank");
    last_joiner = false;
    ddp_.shadow_iteration(notice);
    ++shadowed_;
    if (after_each) after_each(notice.sync);
  }
  ddp_.join_enabled_ = false;
  // The highest rank among the last to join holds the final model.
  std::vector<double> flags(static_cast<size_t>(group.size()), 0.0);
  flags[static_cast<size_t>(group.rank())] = last_joiner ? 1 : 0;
  const auto all = allreduce_values(group, flags, ReduceOp::Sum, "Join: the last ranks to join");
  int root = 0;
  for (int r = 0; r < group.size(); ++r)
    if (all[static_cast<size_t>(r)] > 0) root = r;
  ddp_.broadcast_state(/*parameters=*/true, /*buffers=*/true, root);
  return shadowed_;
}

}  // namespace tandem::dist
