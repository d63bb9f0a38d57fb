// FullyShardedDataParallel (see fsdp.h for the contract). Owns: the units' flat buffers (a Storage
// each, whose memory comes and goes), the shards, the gathers and reductions in flight, and the
// memory released in forward but kept until the op reading it has recorded.
#include "dist/parallel/fsdp.h"
#include "dist/parallel/fsdp_unit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "core/autograd.h"
#include "core/error.h"
#include "dist/group/host_values.h"
#include "dist/parallel/reducer.h"
#include "nn/functional.h"
#include "optim/clip_grad.h"

namespace tandem::dist {

const char* sharding_strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard: return "FULL_SHARD";
    case ShardingStrategy::ShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::NoShard: return "NO_SHARD";
    case ShardingStrategy::HybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard,
                             ShardingStrategy::HybridShard})
    if (name == sharding_strategy_name(s)) return s;
  TANDEM_FAIL("unknown sharding_strategy '", name, "'; expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD");
}

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group, FSDPOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  TANDEM_CHECK(module_ != nullptr, "FullyShardedDataParallel: the module is null");
  TANDEM_CHECK(group_ != nullptr, "FullyShardedDataParallel: the process group is null");
  TANDEM_CHECK(!hybrid() || options_.replicate_group != nullptr,
               "FullyShardedDataParallel: sharding_strategy HYBRID_SHARD needs options.replicate_group (the ranks "
               "that hold this rank's shard on the other nodes); the wrapper's group is the shard group (this "
               "node's ranks)");
  TANDEM_CHECK(hybrid() || options_.replicate_group == nullptr,
               "FullyShardedDataParallel: options.replicate_group is only used by HYBRID_SHARD, not ",
               sharding_strategy_name(options_.sharding_strategy));
  NoGradGuard no_grad;
  for (auto& [name, b] : module_->named_buffers())
    if (b.numel() > 0) broadcast_from_rank0(b);
  cast_buffers();
  const std::map<std::string, Tensor> by_name = [&] {
    std::map<std::string, Tensor> m;
    for (auto& [name, t] : module_->named_parameters()) m.emplace(name, t);
    return m;
  }();
  const MixedPrecision& mp = options_.mixed_precision;
  for (const UnitPlan& plan : plan_units(*module_, options_.auto_wrap_policy,
                                         mp.enabled() ? mp.module_classes_to_ignore : std::set<std::string>{})) {
    auto u = std::make_unique<Unit>();
    u->path = plan.path;
    u->full_precision = plan.full_precision;
    for (const std::string& name : plan.params) u->params.emplace_back(name, by_name.at(name));
    units_.push_back(std::move(u));
  }
  for (size_t k = 0; k < units_.size(); ++k) setup_unit(k);
  train(module_->is_training());
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& u : units_) {
    // The module may outlive this wrapper: its hooks go, and a read of a parameter left sharded fails
    // naming the cause instead of reading nothing.
    for (size_t i = 0; i < u->hooks.size(); ++i)
      if (u->hooks[i] != 0) u->params[i].second.remove_post_accumulate_grad_hook(u->hooks[i]);
    if (u->full) {
      const std::string what = u->describe();
      u->full->set_access_hook([what](Storage&) {
        TANDEM_FAIL("a parameter of FSDP ", what, " was read after its FullyShardedDataParallel was destroyed "
                    "with the parameters sharded; call gather_full_params() before it goes, or load them again");
      });
    }
    try {
      if (u->gathering) u->gathering->wait(group_->timeout());
      if (u->reducing) u->reducing->wait(group_->timeout());
    } catch (...) {
      // A destructor never throws; the group reports its failure on its next use.
    }
  }
}

void FullyShardedDataParallel::setup_unit(size_t k) {
  Unit& u = *units_[k];
  const int world = group_->size();
  u.dtype = u.params.front().second.dtype();
  u.device = u.params.front().second.device();
  for (auto& [name, p] : u.params) {
    TANDEM_CHECK(p.dtype() == u.dtype && p.device() == u.device, "FullyShardedDataParallel: ", u.describe(),
                 " mixes ", u.params.front().second.str(), " ('", u.params.front().first, "') and ", p.str(), " ('",
                 name, "'); a unit's parameters share one dtype and device (wrap the odd ones in a unit of their own)");
    u.offsets.push_back(u.numel);
    u.numel += p.numel();
  }
  setup_precision(u, u.full_precision);
  u.shard_numel = sharded() ? (u.numel + world - 1) / world : u.numel;
  u.total = sharded() ? u.shard_numel * world : u.numel;
  u.full = std::make_shared<Storage>(static_cast<size_t>(u.bytes()), u.device);
  // The parameters' own values, flat: the gathered buffer itself where it stays (NO_SHARD, no casts).
  Tensor flat = transient(u) ? Tensor::empty({u.total}, u.dtype, u.device) : Tensor::from_storage(u.full, {u.total}, u.dtype);
  flat.zero_();
  for (size_t i = 0; i < u.params.size(); ++i) {
    Tensor& p = u.params[i].second;
    flat.slice(0, u.offsets[i], u.offsets[i] + p.numel()).copy_(p.reshape({p.numel()}));
  }
  broadcast_from_rank0(flat);  // every rank starts from rank 0's values
  point_params(u, u.full, u.param_dtype);
  for (size_t i = 0; i < u.params.size(); ++i) {
    Tensor& p = u.params[i].second;
    u.hooks.push_back(0);
    if (p.requires_grad()) {
      ++u.grad_params;
      u.hooks.back() = p.register_post_accumulate_grad_hook([this, k](const Tensor&) { on_grad_ready(k); });
    }
  }
  if (transient(u)) {
    const int64_t lo = sharded() ? group_->rank() * u.shard_numel : 0;
    u.shard = flat.slice(0, lo, lo + u.shard_numel).to(offloaded(u) ? Device::cpu() : u.device).clone();
    u.full->free_memory();
    u.full->set_access_hook([this, k](Storage&) { on_access(k); });
  } else {
    u.shard = flat;
  }
  std::string name = u.root() ? "flat_param" : u.path + ".flat_param";
  register_parameter(name, u.shard);
}

void FullyShardedDataParallel::broadcast_from_rank0(Tensor& t) {
  if (hybrid()) options_.replicate_group->broadcast(t, 0)->wait(options_.replicate_group->timeout());
  group_->broadcast(t, 0)->wait(group_->timeout());
}

std::vector<FullyShardedDataParallel::UnitInfo> FullyShardedDataParallel::units() const {
  std::vector<UnitInfo> out;
  for (auto& u : units_) {
    UnitInfo info{u->path, {}, u->numel, u->shard_numel, u->param_dtype, u->reduce_dtype};
    for (auto& [name, p] : u->params) info.params.push_back(name);
    out.push_back(std::move(info));
  }
  return out;
}

// ---- gathering ----

void FullyShardedDataParallel::on_access(size_t k) {
  Unit& u = *units_[k];
  TANDEM_CHECK(phase_ != Phase::Idle, "FullyShardedDataParallel: a parameter of ", u.describe(),
               " was read outside forward and backward, where its memory is sharded across the ranks; read "
               "parameters through full_state_dict(), or between gather_full_params() and release_full_params()");
  if (phase_ == Phase::Forward) {
    bury(false);
    if (reshard_after_forward())
      for (size_t j = 0; j < units_.size(); ++j)
        if (j != k && units_[j]->accessed && !units_[j]->root()) free_unit(j, /*deferred=*/true);
    gather(k, true);
    u.accessed = true;
    if (!order_recorded_ && std::find(order_.begin(), order_.end(), k) == order_.end()) order_.push_back(k);
    if (options_.forward_prefetch) prefetch_after(k, true);
  } else {
    gather(k, true);
    if (options_.backward_prefetch) prefetch_after(k, false);
  }
}

void FullyShardedDataParallel::gather(size_t k, bool wait) {
  Unit& u = *units_[k];
  if (!transient(u) || u.full->has_memory()) return;
  if (!u.gathering) {
    u.staging = std::make_shared<Storage>(static_cast<size_t>(u.bytes()), u.device);
    Tensor out = Tensor::from_storage(u.staging, {u.total}, u.param_dtype);
    if (u.mixed() || offloaded(u) || !sharded()) {
      // The shard cast (and copied to the device) straight into its own place in the gathered
      // buffer; the all-gather then runs in place, moving param_dtype.
      const int64_t lo = sharded() ? group_->rank() * u.shard_numel : 0;
      Tensor mine = out.slice(0, lo, lo + u.shard_numel);
      fsdp_cast_scaled(mine, u.shard.detach());
      if (sharded()) u.gathering = group_->all_gather_into_tensor(out, mine);
    } else {
      u.gathering = group_->all_gather_into_tensor(out, u.shard.detach());
    }
    peak_gathered_ = std::max(peak_gathered_, memory().gathered_bytes);
    ++stats_.gathers;
    if (!wait && u.gathering) ++stats_.prefetched;
  }
  if (!wait && u.gathering) return;
  if (u.gathering) {
    const auto t0 = std::chrono::steady_clock::now();
    u.gathering->wait(group_->timeout());
    stats_.gather_wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    u.gathering.reset();
  }
  u.full->adopt_memory(*u.staging);
  u.staging.reset();
}

void FullyShardedDataParallel::prefetch_after(size_t k, bool forward) {
  if (!order_recorded_) return;
  const auto at = std::find(order_.begin(), order_.end(), k);
  if (at == order_.end()) return;
  if (forward && at + 1 != order_.end()) gather(*(at + 1), false);
  if (!forward && at != order_.begin()) gather(*(at - 1), false);
}

void FullyShardedDataParallel::free_unit(size_t k, bool deferred) {
  Unit& u = *units_[k];
  u.accessed = false;
  if (!transient(u)) return;
  if (u.gathering) {  // a prefetch nobody read: let it land, then drop it
    u.gathering->wait(group_->timeout());
    u.gathering.reset();
    u.staging.reset();
  }
  if (!u.full->has_memory()) return;
  if (deferred)
    graveyard_.emplace_back(u.full->take_memory(), autograd::recorded_ops());
  else
    u.full->free_memory();
}

void FullyShardedDataParallel::bury(bool all) {
  const uint64_t now = autograd::recorded_ops();
  std::erase_if(graveyard_, [&](const auto& g) { return all || now > g.second; });
}

Tensor FullyShardedDataParallel::forward(const Tensor& x) {
  TANDEM_CHECK(phase_ != Phase::Summoned, "FullyShardedDataParallel: forward between gather_full_params() and "
                                          "release_full_params(); release them first");
  if (module_->is_training() != is_training()) module_->train(is_training());
  check_autocast();
  phase_ = Phase::Forward;
  stats_ = Stats{};
  for (auto& u : units_) u->accessed = false;
  Tensor y;
  try {
    y = module_->forward(x);
  } catch (...) {
    phase_ = Phase::AfterForward;
    throw;
  }
  order_recorded_ = true;
  bury(true);  // no op is running now
  if (!GradMode::enabled()) {
    // No backward follows (evaluation): every unit is released, the root and SHARD_GRAD_OP's too,
    // so that the next forward gathers the shards as they are then (an EMA swapped out again after
    // validation, a loaded checkpoint).
    for (size_t k = 0; k < units_.size(); ++k) free_unit(k, /*deferred=*/false);
    phase_ = Phase::Idle;
    return y;
  }
  if (reshard_after_forward())
    for (size_t k = 0; k < units_.size(); ++k)
      if (!units_[k]->root()) free_unit(k, /*deferred=*/false);
  phase_ = Phase::AfterForward;
  return y;
}

// ---- reduction ----

void FullyShardedDataParallel::on_grad_ready(size_t k) {
  Unit& u = *units_[k];
  if (!callback_queued_) {
    callback_queued_ = true;
    autograd::queue_callback([this] { finish_backward(); });
  }
  if (++u.grads_ready == u.grad_params && require_sync_ && !u.reduced) reduce_unit(k);
}

void FullyShardedDataParallel::reduce_unit(size_t k) {
  Unit& u = *units_[k];
  u.reduced = true;
  NoGradGuard no_grad;
  const int world = group_->size() * (hybrid() ? options_.replicate_group->size() : 1);
  Tensor flat = reduce_input(k);
  for (size_t i = 0; i < u.params.size(); ++i) {
    Tensor& p = u.params[i].second;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    // Divided by the world size first, then summed: the reducer's arithmetic, so FSDP's gradients
    // are DDP's bit for bit where the sums run in rank order. Mixed precision: the cast from
    // param_dtype to reduce_dtype happens in this copy.
    Tensor part = flat.slice(0, u.offsets[i], u.offsets[i] + p.numel());
    if (g.dtype() == kFloat32 && u.reduce_dtype == kFloat32)
      copy_scaled(part, g.contiguous().view({p.numel()}), 1.0 / world);
    else
      fsdp_cast_scaled(part, g, 1.0 / world);
    p.set_grad(Tensor());
  }
  if (sharded()) {
    u.reduce_out = Tensor::empty({u.shard_numel}, u.reduce_dtype, u.device);
    u.reducing = group_->reduce_scatter_tensor(u.reduce_out, flat, ReduceOp::Sum);
  } else {
    u.reduce_out = flat;
    u.reducing = group_->allreduce(flat, ReduceOp::Sum);
  }
  u.reduce_in = flat;
  free_unit(k, /*deferred=*/false);  // between backward's nodes: nothing holds a pointer into it
}

Tensor FullyShardedDataParallel::reduce_input(size_t k) {
  Unit& u = *units_[k];
  // NO_SHARD all-reduces in place into the buffer and keeps it as the result: fresh memory there.
  if (!sharded() || !u.device.is_cpu()) return Tensor::zeros({u.total}, u.reduce_dtype, u.device);
  if (!reduce_slots_[0].buffer.defined()) {  // the first reduction: the same on every rank
    int64_t bytes = 0;
    for (auto& unit : units_)
      if (unit->device.is_cpu())
        bytes = std::max(bytes, unit->total * static_cast<int64_t>(element_size(unit->reduce_dtype)));
    for (ReduceSlot& slot : reduce_slots_)
      slot.buffer = group_->comm_buffer((bytes + 3) / 4, kFloat32, Device::cpu());
  }
  ReduceSlot& slot = reduce_slots_[next_reduce_slot_];
  next_reduce_slot_ ^= 1;
  if (slot.user >= 0) {  // the reduction that read it last: done before the buffer is written again
    Unit& last = *units_[static_cast<size_t>(slot.user)];
    if (last.reducing) last.reducing->wait(group_->timeout());
    last.reduce_in = Tensor();
  }
  slot.user = static_cast<int64_t>(k);
  Tensor flat = Tensor::from_storage(slot.buffer.storage(), {u.total}, u.reduce_dtype);
  flat.zero_();
  return flat;
}

void FullyShardedDataParallel::finish_backward() {
  callback_queued_ = false;
  if (require_sync_)
    for (size_t k = 0; k < units_.size(); ++k)
      if (!units_[k]->reduced && units_[k]->grad_params > 0) reduce_unit(k);
  NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& u : units_)
    if (u->reducing) u->reducing->wait(group_->timeout());
  if (hybrid()) {  // each node's shard gradients, summed across the nodes
    std::vector<std::shared_ptr<Work>> across;
    for (auto& u : units_)
      if (u->reducing) across.push_back(options_.replicate_group->allreduce(u->reduce_out, ReduceOp::Sum));
    for (auto& w : across) w->wait(options_.replicate_group->timeout());
  }
  stats_.reduce_wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (auto& u : units_) {
    if (u->reducing) {
      u->reducing.reset();
      Tensor got = u->reduce_out;
      if (got.dtype() != u->shard.dtype() || got.device() != u->shard.device()) {  // back to float32, on the host
        Tensor master = Tensor::empty(got.shape(), u->shard.dtype(), u->shard.device());
        fsdp_cast_scaled(master, got);
        got = master;
      }
      Tensor g = u->shard.grad();
      if (g.defined())
        g.add_(got);
      else
        u->shard.set_grad(got);
      u->reduce_in = Tensor();
      u->reduce_out = Tensor();
    }
    u->reduced = false;
    u->grads_ready = 0;
  }
  for (size_t k = 0; k < units_.size(); ++k) free_unit(k, /*deferred=*/false);
  bury(true);
  phase_ = Phase::Idle;
}

// ---- whole-model access ----

void FullyShardedDataParallel::gather_full_params() {
  TANDEM_CHECK(phase_ == Phase::Idle || phase_ == Phase::AfterForward,
               "FullyShardedDataParallel::gather_full_params: called during forward or twice");
  phase_ = Phase::Summoned;
  for (size_t k = 0; k < units_.size(); ++k) {
    if (units_[k]->mixed())
      summon(k);  // the float32 values, as PyTorch's summon_full_params gives under mixed precision
    else
      gather(k, true);
  }
}

void FullyShardedDataParallel::release_full_params() {
  TANDEM_CHECK(phase_ == Phase::Summoned,
               "FullyShardedDataParallel::release_full_params: gather_full_params() was not called");
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = *units_[k];
    if (u.summoned) {
      point_params(u, u.full, u.param_dtype);
      u.summoned.reset();
    }
    free_unit(k, /*deferred=*/false);
  }
  phase_ = Phase::Idle;
}

nn::NamedTensors FullyShardedDataParallel::full_state_dict() {
  gather_full_params();
  nn::NamedTensors out;
  try {
    for (auto& [name, t] : module_->state_dict()) {
      const auto own = buffer_dtypes_.find(name);  // a buffer cast to buffer_dtype: saved in its own dtype
      out.emplace_back(name, own == buffer_dtypes_.end() ? t.clone() : t.to(own->second));
    }
  } catch (...) {
    release_full_params();
    throw;
  }
  release_full_params();
  return out;
}

double FullyShardedDataParallel::clip_grad_norm_(double max_norm) {
  TANDEM_CHECK(max_norm > 0, "FullyShardedDataParallel::clip_grad_norm_: max_norm is ", max_norm, ", expected > 0");
  std::vector<Tensor> shards;
  for (auto& u : units_)
    if (u->shard.grad().defined()) shards.push_back(u->shard);
  double local = 0;
  if (!shards.empty()) {
    const Tensor n = optim::clip_grad_norm_(shards, std::numeric_limits<double>::infinity(), 2.0, false);
    local = n.to(Device::cpu()).to(kFloat64).data<double>()[0];
  }
  const double total =
      std::sqrt(allreduce_values(*group_, {local * local}, ReduceOp::Sum, "FSDP clip_grad_norm_ (the shards' norms)")[0]);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1) {
    NoGradGuard no_grad;
    for (auto& s : shards) {
      Tensor g = s.grad();
      g.copy_(nn::functional::scale(g, coef));
    }
  }
  return total;
}

FullyShardedDataParallel::Memory FullyShardedDataParallel::memory() const {
  Memory m;
  for (auto& u : units_) {
    m.shard_bytes += u->shard.nbytes();  // NO_SHARD: the whole flat parameter
    if (u->shard.grad().defined()) m.grad_bytes += u->shard.grad().nbytes();
    if (transient(*u) && u->full->has_memory()) m.gathered_bytes += u->bytes();
    if (u->staging) m.gathered_bytes += u->bytes();
    if (u->summoned) m.gathered_bytes += static_cast<int64_t>(u->summoned->nbytes());
  }
  for (auto& [s, stamp] : graveyard_) m.gathered_bytes += static_cast<int64_t>(s->nbytes());
  m.peak_gathered_bytes = std::max(peak_gathered_, m.gathered_bytes);
  return m;
}

}  // namespace tandem::dist
