// Communication hooks: how the reducer turns one bucket of gradients into its all-reduced value,
// as DDP's register_comm_hook. The reducer hands each bucket to the hook as a GradBucket (its
// index, whether it is the last of this backward, its flat float32 buffer holding the gradients
// already divided by the world size, the parameters, their offsets in the buffer and their
// gradients as views of it). A hook returns a Work; when that Work's wait() returns, the buffer
// must hold the result. A hook may keep state of its own across buckets and iterations
// (make_comm_hook binds a state object, as register_comm_hook(state, hook) does).
//
// Built in: plain all-reduce; fp16/bf16 compression (the bucket travels in half precision and is
// written back in float32), as PyTorch's default_hooks; PowerSGD (dist/parallel/powersgd.h).
//
// Differences from PyTorch: the buffer arrives divided by the world size (PyTorch's hooks get the
// sum's inputs undivided and divide themselves), so a hook that sums gets the average.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/group/process_group.h"

namespace tandem::dist {

struct GradBucket {
  size_t index = 0;        // launch order, 0 first
  bool is_last = false;    // the last bucket this backward launches (PyTorch's is_last())
  Tensor buffer;           // flat float32, on the parameters' device
  std::vector<Tensor> parameters;
  std::vector<int64_t> offsets;    // element offset of each parameter's gradient in buffer
  std::vector<Tensor> gradients;   // views of buffer, shaped as the parameters
  // Bytes this rank hands to collectives for the bucket this time: the reducer sets the buffer's
  // size before calling the hook; a compressing hook sets what it actually sends.
  int64_t bytes_sent = 0;
};

using CommHook = std::function<std::shared_ptr<Work>(ProcessGroup& group, GradBucket& bucket)>;

// A hook with a state object of its own: hook(*state, group, bucket) for every bucket.
template <typename State>
CommHook make_comm_hook(std::shared_ptr<State> state,
                        std::function<std::shared_ptr<Work>(State&, ProcessGroup&, GradBucket&)> hook) {
  return [state = std::move(state), hook = std::move(hook)](ProcessGroup& group, GradBucket& bucket) {
    return hook(*state, group, bucket);
  };
}

std::shared_ptr<Work> allreduce_hook(ProcessGroup& group, GradBucket& bucket);
std::shared_ptr<Work> fp16_compress_hook(ProcessGroup& group, GradBucket& bucket);
std::shared_ptr<Work> bf16_compress_hook(ProcessGroup& group, GradBucket& bucket);

// The settings of the hooks comm_hook_by_name builds (PowerSGD's; the others have none).
struct CommHookOptions {
  int powersgd_rank = 1;                 // matrix_approximation_rank
  int64_t powersgd_start_iter = 1000;    // plain all-reduce before this many iterations
  double powersgd_min_compression_rate = 2.0;
  bool powersgd_error_feedback = true;
  bool powersgd_warm_start = true;
  uint64_t powersgd_seed = 0;
};

// "allreduce", "fp16", "bf16", "powersgd" (a fresh state each call); throws naming the text
// otherwise.
CommHook comm_hook_by_name(const std::string& name, const CommHookOptions& options = {});
inline const char* comm_hook_names() { return "allreduce, fp16, bf16 or powersgd"; }

}  // namespace tandem::dist
