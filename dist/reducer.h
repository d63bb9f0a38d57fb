// Reducer: averages gradients across ranks during backward, as PyTorch DDP's
// reducer does. Parameters are grouped into buckets in reverse registration
// order (the order backward usually produces them), the first capped at
// first_bucket_cap_mb, the rest at bucket_cap_mb. A post-accumulate hook on
// each parameter marks it ready; its gradient, divided by the world size, is
// copied into its bucket's flat buffer (or already lives there, with
// gradient_as_bucket_view). A bucket whose parameters are all ready is handed
// to the comm hook, strictly in bucket order, while backward goes on. A
// callback queued on the autograd engine finalizes at the end of backward:
// it waits for every bucket, writes the results back into .grad, and throws,
// naming the parameters, if some never became ready (the fix is
// find_unused_parameters). After the first iteration the buckets are rebuilt
// once in the order gradients actually arrived on rank 0.
//
// Threads: hooks, launches and finalize run on the thread that runs backward.
// Assumes every rank runs the same model and calls backward the same number
// of times (the collectives must match).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dist/comm_hook.h"
#include "dist/process_group.h"
#include "nn/module.h"

namespace tandem::dist {

struct ReducerOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  bool gradient_as_bucket_view = false;
  bool find_unused_parameters = false;
  bool static_graph = false;
  CommHook comm_hook = allreduce_hook;
};

// What the last synchronised backward did, for benchmarks and logs.
struct ReducerStats {
  int64_t buckets = 0;
  int64_t bytes = 0;             // bytes handed to the comm hook
  double exposed_comm_ms = 0.0;  // finalize's wait: communication not hidden behind backward
  int64_t iteration = 0;
};

class Reducer {
 public:
  Reducer(nn::NamedTensors params, std::shared_ptr<ProcessGroup> group, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call after forward with the outputs backward will start from. With
  // find_unused_parameters it walks the graph and marks unreachable
  // parameters ready at once (contributing zero).
  void prepare_for_backward(const std::vector<Tensor>& outputs);

  // While false, backward accumulates into .grad locally and nothing is sent.
  void set_require_sync(bool sync) { require_sync_ = sync; }
  bool require_sync() const { return require_sync_; }

  const ReducerStats& stats() const { return stats_; }
  // Parameter indices (registration order) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_assignment() const;
  // Called with the bucket index each time a bucket is launched (tests, tracing).
  void set_launch_observer(std::function<void(size_t bucket)> fn) { on_launch_ = std::move(fn); }

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_
    std::vector<int64_t> offsets;  // element offset of each in buffer
    Tensor buffer;                 // flat, float32, on the parameters' device
    size_t pending = 0;
    std::shared_ptr<Work> work;
  };

  void build_buckets(const std::vector<size_t>& order);
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void finalize();
  void reset_iteration();
  Tensor bucket_view(size_t index);
  void rebuild_buckets_from_arrival_order();
  std::vector<bool> reachable_params(const std::vector<Tensor>& outputs) const;

  nn::NamedTensors params_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;    // param index -> bucket
  std::vector<size_t> slot_in_bucket_;
  std::vector<bool> ready_;
  std::vector<size_t> arrival_order_;
  std::vector<bool> unused_static_;  // static_graph: unused set found in iteration 1
  size_t next_launch_ = 0;
  bool expecting_backward_ = false;
  bool finalize_queued_ = false;
  bool rebuilt_ = false;
  bool require_sync_ = true;
  int64_t iteration_ = 0;
  ReducerStats stats_;
  std::function<void(size_t)> on_launch_;
  std::shared_ptr<bool> alive_;  // hooks hold a weak copy: a destroyed reducer ignores them
};

}  // namespace tandem::dist
