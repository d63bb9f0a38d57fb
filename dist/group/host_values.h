// Small host values through a process group: the one way engine code (DDP's model check, the
// reducer's bucket-cap and bucket-order agreement, SyncBatchNorm's statistics, the trainer's
// evaluation sums and stop agreement) runs a collective on numbers it holds on the host. Each
// helper builds its float64 tensor on the group's device (ProcessGroup::comm_device(): the host
// for Gloo, the group's GPU for NCCL, which accepts nothing else), waits for the collective and
// reads the result back, and a failure names `what` and the group. float64 carries every float32
// value and every integer below 2^53 exactly.
// Threads: the caller's; every rank must call the same helpers in the same order.
#pragma once

#include <string>
#include <vector>

#include "dist/group/process_group.h"

namespace tandem::dist {

// A contiguous float64 tensor of `values` on the group's device.
Tensor values_on(const ProcessGroup& group, const std::vector<double>& values);

// Element-wise reduction of every rank's `values` (same length on every rank).
std::vector<double> allreduce_values(ProcessGroup& group, const std::vector<double>& values, ReduceOp op,
                                     const std::string& what);
// Rank root's `values` on every rank (same length on every rank).
std::vector<double> broadcast_values(ProcessGroup& group, const std::vector<double>& values, int root,
                                     const std::string& what);
// [r]: rank r's `values` (same length on every rank).
std::vector<std::vector<double>> allgather_values(ProcessGroup& group, const std::vector<double>& values,
                                                  const std::string& what);

}  // namespace tandem::dist
