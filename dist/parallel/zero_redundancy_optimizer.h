// ZeroRedundancyOptimizer: optimizer state sharded across the ranks of a process group, as
// torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO stage 1). Every parameter belongs to one
// rank (PyTorch's sorted-greedy partition, zero_partition below); each rank builds a local
// optimizer of the wrapped type, with the same hyper-parameters, over its own shard only, so it
// holds state (momentum, Adam's moments, ...) for about 1/world of the parameters. step() runs the
// local optimizer, then every rank's updated shard is broadcast from its owner, so all replicas end
// the step with the same parameters the unsharded optimizer would give (the same kernels on the
// same values: equal bit for bit).
//
// Contract:
// - Every rank constructs it with the same groups (same shapes, same order) and calls step(),
//   consolidate_state_dict() and load_state_dict() in the same order; gradients must already be
//   the same on every rank (DDP's average), as with the unsharded optimizer.
// - A rank whose shard is empty (more ranks than parameters) builds no local optimizer and still
//   takes part in every broadcast.
// - param_groups() are the full groups; their lr and weight_decay (set by hand or by a scheduler)
//   reach the local optimizer at the next step(), consolidate_state_dict() or load_state_dict().
// - zero_grad() clears the gradients of every parameter (the base class's).
// - state_dict() is the unsharded optimizer's state dict ("state.<i>.<name>" with i counting all
//   parameters, "group.<g>.lr"), available on rank `to` after consolidate_state_dict(to) ran on
//   every rank; it reflects the state at that call (tensors on the host), the lrs as they are now.
//   load_state_dict() takes such a full dict (from this class or from the unsharded optimizer) and
//   keeps only this rank's shard.
// - parameters_as_bucket_view (PyTorch's option): the parameters each rank owns become views of
//   one flat buffer per owner, so a step broadcasts one tensor per rank instead of one per
//   parameter. Needs every parameter on the group's device (ProcessGroup::comm_device()) and of one
//   dtype. It re-points the parameters' data (Tensor::set_data): moving the model afterwards
//   (Module::to) undoes it. Without it, a parameter on the group's device is broadcast in place
//   and any other crosses to the group's device and back.
// - Every wait uses the group's timeout; a failed or late broadcast throws, naming the shard.
// Threads: the caller's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/group/process_group.h"
#include "optim/optimizer.h"

namespace tandem::dist {

// PyTorch's ZeroRedundancyOptimizer._partition_parameters: for each group in order, its parameters
// sorted by numel, largest first (stable: equal sizes keep their order), each given to the rank
// with the smallest total numel so far (the lowest rank on a tie); the totals carry over from one
// group to the next. numels[g][k]: numel of group g's k-th parameter. Returns [rank][group]: the
// overall indices (groups in order) of the parameters that rank owns, in assignment order.
std::vector<std::vector<std::vector<size_t>>> zero_partition(const std::vector<std::vector<int64_t>>& numels,
                                                             int world);

struct ZeroOptions {
  bool parameters_as_bucket_view = false;
};

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  // Builds the local optimizer over this rank's groups (the same count as the full groups, each
  // with its lr and weight_decay; some may be empty). Must keep the groups as given.
  using LocalFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

  ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, LocalFactory make_local,
                          std::shared_ptr<ProcessGroup> group, ZeroOptions options = {});

  void step() override;
  // Collective: gathers every rank's shard of the state on rank `to`.
  void consolidate_state_dict(int to = 0);
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;
  // This rank's share: the bytes of its local optimizer's state.
  int64_t state_bytes() const override;

  int rank_of(size_t index) const { return owner_.at(index); }  // owner of the index-th parameter
  // Overall indices of the parameters `rank` owns, in its local optimizer's order.
  const std::vector<size_t>& shard(int rank) const { return shards_.at(static_cast<size_t>(rank)); }
  optim::Optimizer* local_optimizer() { return local_.get(); }  // null where the shard is empty
  ProcessGroup& process_group() { return *group_; }

 private:
  void sync_groups_to_local();
  void broadcast_shard(int owner, std::vector<std::shared_ptr<Work>>& works, std::vector<Tensor>& staged);
  void build_buckets();

  std::shared_ptr<ProcessGroup> group_;
  ZeroOptions options_;
  std::vector<Tensor> all_;               // every parameter, groups in order
  std::vector<int> owner_;                // [i]: the rank that owns parameter i
  std::vector<size_t> local_index_;       // [i]: its index in its owner's local optimizer
  std::vector<std::vector<size_t>> shards_;  // [r]: overall indices owned by rank r
  std::unique_ptr<optim::Optimizer> local_;
  std::vector<Tensor> buckets_;           // [r]: rank r's flat parameters (bucket view only)
  std::map<std::string, Tensor> consolidated_;  // "state.<i>.<name>" after consolidate_state_dict
  bool has_consolidated_ = false;
};

// A LocalFactory building optimizer Opt (SGD, Adam, AdamW, Adadelta) with `options` over the
// groups given (each group's lr and weight_decay win over the options').
template <class Opt, class Options>
ZeroRedundancyOptimizer::LocalFactory local_optimizer(const Options& options) {
  return [options](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<Opt>(std::move(groups), options);
  };
}

// As PyTorch's ZeroRedundancyOptimizer(params, optimizer_class=Opt, **defaults): one group with the
// options' lr and weight_decay, sharded over `group`.
template <class Opt, class Options>
std::unique_ptr<ZeroRedundancyOptimizer> make_zero_optimizer(std::vector<Tensor> params,
                                                             std::shared_ptr<ProcessGroup> group,
                                                             const Options& options, ZeroOptions zero = {}) {
  optim::ParamGroup g;
  g.params = std::move(params);
  g.lr = options.lr;
  g.weight_decay = options.weight_decay;
  return std::make_unique<ZeroRedundancyOptimizer>(std::vector<optim::ParamGroup>{std::move(g)},
                                                   local_optimizer<Opt>(options), std::move(group), zero);
}

}  // namespace tandem::dist
