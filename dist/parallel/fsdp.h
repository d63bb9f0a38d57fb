// FullyShardedDataParallel: parameters, gradients and optimizer state sharded across the ranks of a
// process group, as torch.distributed.fsdp.FullyShardedDataParallel (ZeRO-3) does with flat
// parameters (use_orig_params=False).
//
// Units. An auto-wrap policy picks subtrees of the module: every module of a listed class (PyTorch's
// transformer_auto_wrap_policy, by unqualified C++ class name: "Block", "BasicBlock"), or, by
// size, every subtree holding at least min_num_params parameters not already in a unit below it
// (size_based_auto_wrap_policy). Children are planned before their parents, and what no unit takes
// forms the root unit. Each unit's parameters (one dtype and device per unit) are laid end to end
// in one flat buffer padded to a multiple of the world size; the module's parameter tensors become
// views of it (same tensor objects, so the module's code is unchanged), and rank r keeps elements
// [r*S, (r+1)*S) as its shard, a leaf tensor of its own: parameters() are these shards, and any
// optimizer steps on them unchanged.
//
// Gathering. Between uses a unit's flat buffer has no memory (core/storage.h: free_memory). The
// first read of one of its parameters in forward or backward all-gathers it
// (ProcessGroup::all_gather_into_tensor) and waits; so a unit is gathered just before it runs,
// whatever the module's code looks like, and a unit run twice (or a weight tied across units) is
// simply gathered again. The first forward records the order in which units are first read; from
// then on reading unit k starts the gather of the unit after it (forward prefetch) or before it
// (backward prefetch), which runs on the group's worker while unit k computes.
//   FULL_SHARD     a non-root unit's memory is freed in forward once the op that last read it has
//                  finished (autograd::recorded_ops() advanced) and another unit is read, and at the
//                  end of forward; the root stays gathered until its gradients are reduced.
//   SHARD_GRAD_OP  (ZeRO-2) gathered units stay until their gradients are reduced.
//   NO_SHARD       nothing is sharded: each unit's flat buffer is its parameter, gradients are
//                  all-reduced (DDP's arithmetic, one bucket per unit).
//   HYBRID_SHARD   FULL_SHARD within the wrapper's group (the ranks of one node), replicated across
//                  options.replicate_group (the ranks holding the same shard on the other nodes, as
//                  PyTorch's process_group=(shard_group, replicate_group)): gathers stay inside a
//                  node; each shard's gradient is reduce-scattered in the node, then all-reduced
//                  across the replicas.
// Reduction. Post-accumulate hooks on the module's parameters count each unit's final gradients;
// when a unit's last one is in, its gradients are copied into a flat buffer (zeros where a
// parameter got none, and in the padding), divided by the world size and reduce-scattered (summed:
// the reducer's arithmetic, so the gradients are DDP's) on the group's
// worker while backward goes on (the reducer's overlap), the full gradients are dropped and the
// unit's memory freed. At the end of backward (autograd::queue_callback) any unit not yet reduced
// is reduced in unit order, every reduction is waited for, and each shard's .grad receives its
// part (added to a gradient already there, as PyTorch accumulates). Inside no_sync() nothing is
// reduced: the full gradients accumulate on the module's parameters until a synchronised backward.
//
// Memory: a gathered unit's buffer is released in forward only once the op that may be reading it
// has recorded (autograd::recorded_ops() moved on), so a pointer an op took stays valid; under
// NoGradGuard nothing records, so evaluation keeps units gathered until the end of its forward.
// Errors name the fix: reading a sharded parameter outside forward and backward (use
// full_state_dict() or gather_full_params()), units of mixed dtypes or devices, a wrap class that
// no module has, a strategy that is not available. Every rank must run the same units in the same
// order (the collectives are issued as units are read), as DDP's static graph requires.
// Assumes: the module is on its device before wrapping and not modified afterwards; one
// FullyShardedDataParallel per module; forward and backward on one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/storage.h"
#include "dist/group/process_group.h"
#include "nn/module.h"

namespace tandem::optim {
class Optimizer;
}

namespace tandem::dist {

enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard };
const char* sharding_strategy_name(ShardingStrategy s);  // "FULL_SHARD", ...
// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD" (PyTorch's names); throws naming them.
ShardingStrategy parse_sharding_strategy(const std::string& name);

struct AutoWrapPolicy {
  std::set<std::string> module_classes;  // unqualified class names; empty: no class rule
  int64_t min_num_params = 0;            // > 0: the size rule
};

// PyTorch's MixedPrecision(param_dtype, reduce_dtype, buffer_dtype). The float32 shard stays the
// master copy: a gather casts it to param_dtype (into the gather's own buffer, so the all-gather moves
// param_dtype), forward and backward compute with param_dtype parameters, the gradients are cast to
// reduce_dtype as they are copied into the reduction's buffer (default: param_dtype), and the reduced
// shard gradient is cast back to float32 for the optimizer. Modules of a class in
// module_classes_to_ignore (PyTorch's default: batch norm) keep full precision: each becomes a unit of
// its own, before the auto-wrap policy runs. Under no_sync the full gradients accumulate in
// param_dtype, as PyTorch's do. Checkpoints and full_state_dict hold the float32 values.
struct MixedPrecision {
  std::optional<DType> param_dtype;   // float16 / bfloat16 (float32: none); none: the parameters' own
  std::optional<DType> reduce_dtype;  // none: param_dtype (or the parameters' own)
  std::optional<DType> buffer_dtype;  // floating buffers cast to this at wrapping; none: kept
  std::set<std::string> module_classes_to_ignore = {"BatchNorm2d"};
  bool enabled() const { return param_dtype || reduce_dtype || buffer_dtype; }
};
// "bfloat16", "float16", "float32" (also with PyTorch's "torch." prefix, and "bf16", "fp16", "fp32");
// throws naming the accepted ones.
DType parse_mixed_precision_dtype(const std::string& name);

// PyTorch's CPUOffload(offload_params). On a CUDA model the float32 shards, their gradients and so the
// optimizer's state live in host memory; a gather copies the shard (cast to param_dtype) to the
// device, and the reduced gradient shard comes back to the host, where the optimizer steps. On a CPU
// model everything already is in host memory: accepted, and nothing changes.
struct CPUOffload {
  bool offload_params = false;
};

struct FSDPOptions {
  ShardingStrategy sharding_strategy = ShardingStrategy::FullShard;
  AutoWrapPolicy auto_wrap_policy;
  bool forward_prefetch = true;
  bool backward_prefetch = true;
  // HYBRID_SHARD only: the group across which this rank's shard is replicated.
  std::shared_ptr<ProcessGroup> replicate_group;
  MixedPrecision mixed_precision;
  CPUOffload cpu_offload;
};

// The units `policy` makes of `module`: children before parents, then the root unit (the rest, path
// "") last; each with the module's parameter names it holds. A parameter registered under several
// names (tied) goes to the root unit. Throws naming a wrap class that no module has.
// Modules of a class in `full_precision_classes` (mixed precision's module_classes_to_ignore) become
// units of their own first, marked full_precision.
struct UnitPlan {
  std::string path;
  std::vector<std::string> params;
  bool full_precision = false;
};
std::vector<UnitPlan> plan_units(const nn::Module& module, const AutoWrapPolicy& policy,
                                 const std::set<std::string>& full_precision_classes = {});
// The module's unqualified C++ class name ("Linear" for tandem::nn::Linear).
std::string module_class_name(const nn::Module& m);

class FullyShardedDataParallel : public nn::Module {
 public:
  // Collective: plans the units, broadcasts rank 0's parameters and buffers, keeps this rank's shards.
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                           FSDPOptions options = {});
  ~FullyShardedDataParallel() override;
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // Runs the module (in this wrapper's train/eval mode).
  Tensor forward(const Tensor& x) override;

  nn::Module& module() { return *module_; }
  ProcessGroup& process_group() { return *group_; }
  const FSDPOptions& options() const { return options_; }

  struct UnitInfo {
    std::string path;                 // the module's dotted path; "" for the root unit
    std::vector<std::string> params;  // the module's parameter names it holds, in its order
    int64_t numel = 0;                // parameters' elements
    int64_t shard_numel = 0;          // this rank's shard (numel padded to the world size / world)
    DType param_dtype = kFloat32;     // the dtype it is gathered and computed in
    DType reduce_dtype = kFloat32;    // the dtype its gradients are reduced in
  };
  std::vector<UnitInfo> units() const;

  // While alive, backward accumulates full gradients on the module's parameters without
  // communication; the next synchronised backward reduces the sum.
  class NoSync {
   public:
    explicit NoSync(FullyShardedDataParallel& f) : f_(f), prev_(f.require_sync_) { f_.require_sync_ = false; }
    ~NoSync() { f_.require_sync_ = prev_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    FullyShardedDataParallel& f_;
    bool prev_;
  };
  [[nodiscard]] std::unique_ptr<NoSync> no_sync() { return std::make_unique<NoSync>(*this); }

  // clip_grad_norm_ over the shards: the norm of the whole (unsharded) gradient, all-reduced, and
  // every shard's gradient scaled by min(1, max_norm / (norm + 1e-6)). Collective. Returns the norm.
  double clip_grad_norm_(double max_norm);

  // Collective: every unit gathered, the module's state_dict (its own names, PyTorch's) copied
  // out on every rank, the units' memory freed again.
  nn::NamedTensors full_state_dict();
  // Collective: gathers every unit and keeps it gathered until release_full_params() (also
  // collective), so that the module's parameters can be read (evaluation, export).
  void gather_full_params();
  void release_full_params();

  // Checkpoints. save_full: collective; rank 0 writes the module's state dict (its own names, as
  // PyTorch's model.state_dict() has them) to `path` as safetensors. save_sharded: collective; each
  // rank writes <dir>/shard-<rank>-of-<world>.safetensors (its shards "param.<unit>", `optimizer`'s
  // state over them "optim.<key>", when given, and its buffers "buffer.<name>"), then rank 0 writes <dir>/fsdp.json
  // (world size, strategy, every unit's path, parameter names and shapes). Files are written under a
  // temporary name and renamed, so an older checkpoint stays whole until the new one is.
  // load_sharded: collective; checks the units and parameters match (naming the first that does not),
  // then loads: on the world size it was saved with, each rank reads its own file (a bitwise resume);
  // on another, each rank rebuilds its new shard, and the optimizer's per-element state, from the old
  // shards (re-sharding). Under HYBRID_SHARD the world is the shard group's (one node): the first node
  // writes the files, and every node reads them.
  void save_full(const std::string& path);
  // The optimizer's state over the shards, unsharded (collective): each per-element buffer of unit k
  // ("state.<k>.<buffer>", shard-sized on every rank) all-gathered and cut to the unit's elements;
  // scalars ("state.<k>.step", "group.<g>.lr") as they are. What a single-file checkpoint keeps, so
  // that it can resume on any world size. shard_optimizer_state is its inverse for this rank (the
  // padding's elements are zero): load its result with Optimizer::load_state_dict. The optimizer's
  // parameters must be parameters(), in that order.
  std::map<std::string, Tensor> full_optimizer_state(const optim::Optimizer& optimizer);
  std::map<std::string, Tensor> shard_optimizer_state(const std::map<std::string, Tensor>& full) const;
  // Tensors laid out as parameters() (one shard-sized tensor per unit, in unit order, e.g. an
  // exponential moving average of the shards) as the module's full parameters: collective, each
  // unit's all-gathered and cut into the module's parameters (their names and shapes), as
  // full_state_dict gathers the weights. shard_tensors is its inverse on this rank (no
  // communication): from the module's full parameters by name (every one needed; a missing or
  // misshapen one throws naming it), this rank's shard of each unit (zeros in the padding).
  nn::NamedTensors unshard_tensors(const std::vector<Tensor>& shards);
  std::vector<Tensor> shard_tensors(const std::map<std::string, Tensor>& full) const;
  void save_sharded(const std::string& dir, const optim::Optimizer* optimizer = nullptr);
  void load_sharded(const std::string& dir, optim::Optimizer* optimizer = nullptr);

  // Bytes this rank holds: its shards, their gradients, gathered flat buffers now and at most so far.
  struct Memory {
    int64_t shard_bytes = 0, grad_bytes = 0, gathered_bytes = 0, peak_gathered_bytes = 0;
  };
  Memory memory() const;

  // What the last iteration's communication cost the compute thread, as the reducer's
  // exposed_comm_ms: the time forward and backward waited for gathers (prefetch hides the rest), and
  // the end of backward's wait for the reductions. Reset by each forward.
  struct Stats {
    double gather_wait_ms = 0, reduce_wait_ms = 0;
    int64_t gathers = 0;    // all-gathers issued this iteration (a unit read again after release counts again)
    int64_t prefetched = 0; // of which issued ahead of the read
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Unit;
  enum class Phase { Idle, Forward, AfterForward, Summoned };

  void setup_unit(size_t k);
  void on_access(size_t k);
  void gather(size_t k, bool wait);
  // Releases a unit's gathered memory: at once, or (in forward, where an op may still hold a
  // pointer into it) kept until the op that is running has recorded.
  void free_unit(size_t k, bool deferred);
  void bury(bool all);
  void prefetch_after(size_t k, bool forward);
  void on_grad_ready(size_t k);
  void reduce_unit(size_t k);
  // The zeroed flat buffer unit k's gradients are reduced from: on a sharded CPU unit, one of two
  // buffers from the group's comm_buffer (over shared memory the reduce-scatter then reads the
  // peers' inputs in place), used in turn, each reused once the reduction that last used it has
  // finished; else fresh memory.
  Tensor reduce_input(size_t k);
  void finish_backward();
  // The unit whose per-element optimizer state "state.<unit>.<buffer>" is (shard-sized, or the
  // unit's full size when `full`); null for scalars, other keys and NO_SHARD.
  const Unit* per_element_unit(const std::string& key, const Tensor& t, bool full) const;
  bool sharded() const { return options_.sharding_strategy != ShardingStrategy::NoShard; }
  // Whether a unit's gathered buffer comes and goes: sharded, cast to param_dtype, or offloaded.
  bool transient(const Unit& u) const;
  bool offloaded(const Unit& u) const;
  // Points the unit's parameters at `flat` (`dtype`, the unit's layout).
  void point_params(Unit& u, const std::shared_ptr<Storage>& flat, DType dtype);
  // Mixed precision: the unit's dtypes, floating buffers cast to buffer_dtype (fsdp_precision.cpp).
  void setup_precision(Unit& u, bool full_precision);
  void cast_buffers();
  // The gathered values of unit k, float32 (a mixed unit while gather_full_params() holds it).
  void summon(size_t k);
  void check_autocast() const;
  // A barrier over every rank of the job (both groups under HYBRID_SHARD).
  void barrier_all();
  bool hybrid() const { return options_.sharding_strategy == ShardingStrategy::HybridShard; }
  bool reshard_after_forward() const {
    return options_.sharding_strategy == ShardingStrategy::FullShard || hybrid();
  }
  // Rank 0's values of `t` on every rank (through the replicas first under HYBRID_SHARD).
  void broadcast_from_rank0(Tensor& t);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  FSDPOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;
  Phase phase_ = Phase::Idle;
  bool require_sync_ = true;
  bool callback_queued_ = false;
  std::vector<size_t> order_;       // units in the order the first forward read them
  bool order_recorded_ = false;
  std::vector<std::pair<std::shared_ptr<Storage>, uint64_t>> graveyard_;  // (memory, recorded_ops() then)
  int64_t peak_gathered_ = 0;
  std::map<std::string, DType> buffer_dtypes_;  // buffers cast to buffer_dtype: their own dtype
  struct ReduceSlot {
    Tensor buffer;       // comm_buffer bytes (as float32) of the largest sharded CPU unit's reduction
    int64_t user = -1;   // the unit whose reduction used it last
  };
  ReduceSlot reduce_slots_[2];
  int next_reduce_slot_ = 0;
  Stats stats_;
};

}  // namespace tandem::dist
