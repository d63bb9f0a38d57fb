// DistributedDataParallel: wraps a module so that backward averages its
// gradients across the ranks of a process group (through a Reducer), as
// torch.nn.parallel.DistributedDataParallel does. The constructor checks that
// every rank holds the same model (names, shapes, dtypes) and broadcasts rank
// 0's parameters and buffers. forward() broadcasts buffers from rank 0 first
// (broadcast_buffers), runs the module, and prepares the reducer with the
// output. The wrapped module is child "module", so state_dict names carry the
// "module." prefix, as PyTorch's do; save module() to drop it.
#pragma once

#include <memory>

#include "dist/parallel/reducer.h"
#include "nn/module.h"

namespace tandem::dist {

struct DDPOptions {
  ReducerOptions reducer;
  bool broadcast_buffers = true;
};

class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                          DDPOptions options = {});
  Tensor forward(const Tensor& x) override;

  nn::Module& module() { return *module_; }
  const DDPOptions& options() const { return options_; }
  Reducer& reducer() { return *reducer_; }
  ProcessGroup& process_group() { return *group_; }

  // While alive, backward accumulates gradients locally (no communication);
  // the next backward outside it reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(Reducer& r) : r_(r), prev_(r.require_sync()) { r_.set_require_sync(false); }
    ~NoSync() { r_.set_require_sync(prev_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Reducer& r_;
    bool prev_;
  };
  [[nodiscard]] std::unique_ptr<NoSync> no_sync() { return std::make_unique<NoSync>(*reducer_); }

 private:
  friend class Join;
  // What an active rank tells the joined ones at the start of each forward (dist/parallel/join.h).
  struct JoinNotice {
    int active = 0;           // ranks still training
    bool sync = false;        // some active rank reduces gradients in this backward
    bool terminate = false;   // a joined rank asked everyone to stop (throw_on_early_termination)
    bool buffers = false;     // the forward broadcasts buffers
    int authoritative = 0;    // the highest active rank: the source of buffers
  };
  JoinNotice exchange_join_notice(bool joined, bool terminate);
  // A joined rank's share of one iteration of the others: the same collectives, with zeros.
  void shadow_iteration(const JoinNotice& notice);

  void verify_same_model();
  void broadcast_state(bool parameters, bool buffers, int root = 0);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::unique_ptr<Reducer> reducer_;
  bool join_enabled_ = false;  // inside a Join: each forward tells the joined ranks first
};

}  // namespace tandem::dist
