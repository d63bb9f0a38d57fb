// Reducer: averages gradients across ranks during backward, as PyTorch DDP's reducer does.
// Parameters are grouped into buckets in reverse registration order (the order backward usually
// produces them), the first capped at first_bucket_cap_mb, the rest at bucket_cap_mb. A
// post-accumulate hook on each parameter marks it ready; its gradient, divided by the world size,
// is copied into its bucket's flat buffer (or already lives there, with gradient_as_bucket_view).
// A bucket whose parameters are all ready is handed to the comm hook (a GradBucket), strictly in
// bucket order, while backward goes on. Once every bucket is launched, a callback queued on the
// autograd engine finalizes at the end of backward: it waits for each bucket in turn and writes
// its results back into .grad (early buckets' copies overlap later buckets' reduction).
//
// PyTorch's semantics, kept:
// - A hook that fires with no prepared reduction (no DDP forward since the last synchronised
//   backward, or under no_sync) is ignored: nothing is sent.
// - find_unused_parameters: prepare_for_backward walks the graph from the outputs; parameters it
//   cannot reach are marked ready (contributing their .grad if they have one, else zeros) at the
//   first hook. Whether each parameter was used (its hook fired with a gradient, no_sync
//   micro-steps included) is all-reduced once the last bucket is launched; a parameter no rank
//   used keeps its .grad untouched (undefined if it had none), so momentum and weight decay do not
//   move it; one used on some ranks gets the average, like the others.
// - static_graph: the first iteration reduces everything at the end of backward and learns which
//   parameters are unused on this rank and how many hooks each gets per iteration; later
//   iterations walk no graph, and a parameter is ready after its last hook of the iteration.
// - The buckets are rebuilt once, in the order gradients arrived on rank 0 in the first reducing
//   iteration (static_graph: the second), at the start of the next forward (prepare_for_forward),
//   not inside backward; skipped, as PyTorch does, with find_unused_parameters without
//   static_graph (the order may change every iteration).
// - Backward ending with parameters that never became ready (without find_unused_parameters)
//   throws, naming them.
// Past PyTorch: several DDP forwards before one backward work with find_unused_parameters too
// (the unused set is what none of their outputs reaches).
//
// Automatic cap (bucket_cap_mb <= 0): the constructor times all-reduces of 4 KiB and of a probe
// (up to 16 MiB) over the group and picks ~10 latencies' worth of bytes at the measured
// bandwidth, clamped to [1 MiB, min(100 MiB, a quarter of the gradients)]; rank 0's choice is
// broadcast.
//
// Threads: hooks, launches and finalize run on the thread that runs backward. Assumes every rank
// runs the same model and calls backward the same number of times (the collectives must match);
// Join (dist/parallel/join.h) covers ranks that run out of data first.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device_timer.h"
#include "dist/parallel/comm_hook.h"
#include "dist/group/process_group.h"
#include "nn/module.h"

namespace tandem::dist {

struct ReducerOptions {
  // MiB per bucket after the first. 0 or negative: auto, measured once by the constructor (see
  // AutoBucketCap): ~10 all-reduce latencies' worth of bytes at the measured bandwidth.
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
  int64_t bytes = 0;             // bytes the comm hook sent for the buckets (GradBucket::bytes_sent)
  int64_t bucket_bytes = 0;      // bytes of the buckets themselves (what plain all-reduce sends)
  // Communication not hidden behind backward, for the synchronised backward exposed_comm_iteration:
  // on a host group (Gloo) finalize's waits, this backward; on a device group (NCCL) the compute
  // stream's wait for the buckets, measured on the device and read without waiting, so it is the
  // previous synchronised backward's (-1: none measured yet).
  double exposed_comm_ms = 0.0;
  int64_t exposed_comm_iteration = -1;
  double finalize_ms = 0.0;      // all of finalize: the waits and writing the gradients back
  int64_t iteration = 0;
  int64_t graph_walks = 0;       // prepare_for_backward's searches for unused parameters, in total
  int64_t rebuilds = 0;          // bucket rebuilds, in total (0 or 1)
};

// What the automatic bucket cap measured and chose (ReducerOptions::bucket_cap_mb <= 0). The values
// are rank 0's, broadcast so that every rank builds the same buckets.
struct AutoBucketCap {
  bool measured = false;      // false: a fixed cap, or a world of one (nothing to measure)
  double latency_us = 0.0;    // median all-reduce time of a 4 KiB message
  double bandwidth_gbps = 0.0;  // probe bytes / probe time, GB/s (algorithm bandwidth, latency included)
  double probe_mb = 0.0;      // the probe message, MiB
  double cap_mb = 0.0;        // the cap chosen, MiB
};

class Reducer {
 public:
  // The automatic cap for a measured per-all-reduce latency and bandwidth and a model with
  // total_bytes of gradients: the bytes that take kAutoLatencyFactor latencies to send (so the fixed
  // cost of a bucket is at most ~1/kAutoLatencyFactor of its time), at least 1 MiB, at most a
  // quarter of the gradients (so backward can overlap at least 4 buckets) or 100 MiB, in MiB.
  static constexpr double kAutoLatencyFactor = 10.0;
  static double auto_bucket_cap_mb(double latency_us, double bandwidth_gbps, int64_t total_bytes);

  Reducer(nn::NamedTensors params, std::shared_ptr<ProcessGroup> group, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call at the start of forward (grad mode on): rebuilds the buckets once, when due. Collective.
  void prepare_for_forward();
  // Call after forward with the outputs backward will start from. With find_unused_parameters
  // (and not static_graph) it walks the graph from them; a second call before backward adds its
  // outputs to the first's.
  void prepare_for_backward(const std::vector<Tensor>& outputs);

  // A joined rank's part in a synchronised backward of the others (dist/parallel/join.h): every bucket
  // through the comm hook as zeros, and the use map as zeros, in the order the others send them;
  // then the result (the others' average) goes into .grad as finalize writes it.
  void shadow_backward();

  // While false, backward accumulates into .grad locally and nothing is sent.
  void set_require_sync(bool sync) { require_sync_ = sync; }
  bool require_sync() const { return require_sync_; }

  const ReducerStats& stats() const { return stats_; }
  // The cap in use after the first bucket (MiB): the option, or what auto chose.
  double bucket_cap_mb() const { return options_.bucket_cap_mb; }
  const AutoBucketCap& auto_bucket_cap() const { return auto_cap_; }
  // Parameter indices (registration order) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_assignment() const;
  const nn::NamedTensors& parameters() const { return params_; }
  // Parameter indices this rank found unused in the last prepared iteration (static_graph: the set
  // learned in the first).
  std::vector<size_t> unused_parameters() const;
  // Called with the bucket index each time a bucket is launched (tests, tracing).
  void set_launch_observer(std::function<void(size_t bucket)> fn) { on_launch_ = std::move(fn); }

 private:
  struct Bucket {
    GradBucket grad;               // buffer, parameters, offsets and gradient views, built once
    std::vector<size_t> params;    // indices into params_
    size_t pending = 0;
    std::shared_ptr<Work> work;
  };

  bool dynamic_find_unused() const { return options_.find_unused_parameters && !options_.static_graph; }
  bool static_first() const { return options_.static_graph && !static_learned_; }
  bool static_after_first() const { return options_.static_graph && static_learned_; }
  bool should_rebuild() const { return (options_.static_graph || !options_.find_unused_parameters) && !rebuilt_; }

  void measure_auto_bucket_cap();
  void build_buckets(const std::vector<size_t>& order);
  void on_hook(size_t index);
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void end_of_backward();
  void reduce_all_at_end();
  void finalize();
  void fail_unready() const;
  bool globally_unused(size_t index);
  void write_back(size_t index, bool global_unused);
  void reset_iteration();
  const Tensor& bucket_view(size_t index) const;
  void rebuild_buckets();
  std::vector<bool> reachable_params(const std::vector<Tensor>& outputs) const;

  nn::NamedTensors params_;
  std::shared_ptr<ProcessGroup> group_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;    // param index -> bucket
  std::vector<size_t> slot_in_bucket_;
  std::vector<uint64_t> hook_handles_;
  std::vector<bool> ready_;
  std::vector<bool> unused_;         // this iteration: marked ready at the first hook
  std::vector<size_t> arrival_order_;  // for the rebuild
  size_t next_launch_ = 0;
  bool expecting_backward_ = false;  // a reduction is prepared
  bool hook_fired_ = false;          // this reduction has seen a hook
  bool callback_queued_ = false;     // end_of_backward is queued for the running backward
  bool rebuilt_ = false;
  bool require_sync_ = true;
  int64_t iteration_ = 0;
  // Which parameters had a gradient (1) on this rank since the last synchronised backward, and
  // the sum over ranks once reduced (find_unused_parameters, static_graph's first iteration).
  std::vector<float> local_used_;
  Tensor local_used_comm_;
  std::shared_ptr<Work> local_used_work_;
  bool local_used_reduced_ = false;
  // static_graph: learned in the first iteration.
  bool static_learned_ = false;
  std::vector<int> hooks_seen_;      // hooks per parameter in the first iteration
  std::vector<int> hooks_left_;      // this iteration's hooks still to come
  std::vector<bool> static_unused_;
  ReducerStats stats_;
  AutoBucketCap auto_cap_;
  std::function<void(size_t)> on_launch_;
  std::shared_ptr<bool> alive_;  // queued callbacks hold a weak copy: a destroyed reducer ignores them
  std::unique_ptr<DeviceTimer> comm_timer_;  // device groups: the compute stream's wait for the buckets
};

// dst = src * factor (float32, same shape), in one pass on the CPU: how the reducer divides gradients
// by the world size (FSDP divides the same way, so their gradients agree bit for bit).
void copy_scaled(Tensor& dst, const Tensor& src, double factor);

}  // namespace tandem::dist
