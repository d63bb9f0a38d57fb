// EMAHook (MMEngine's, with its ExponentialMovingAverage, ema.h): keeps an exponential moving
// average of the model's parameters (and buffers with update_buffers), updated after every training
// iteration from begin_iter (or begin_epoch) on and a copy of the model before; validation runs with
// the averages swapped into the model and swapped back after it. Checkpoints carry the averages as
// ema_state_dict.module.<name> and ema_state_dict.steps tensors in the state file (the weights file
// keeps the model's own weights), and a resume restores them; a checkpoint without them starts the
// average from the resumed weights, with a warning.
// Under FullyShardedDataParallel each rank averages its own shards (the wrapper's parameters(), no
// gathers) and the module's buffers; validation swaps the averaged shards in (the wrapper gathers
// them as it runs), and checkpoints hold the averages as the module's full tensors, gathered as
// the weights are (the same ema_state_dict as under DDP), sliced back into shards on a resume. With
// SHARDED_STATE_DICT checkpoints the averages stay sharded: <checkpoint>/ema/ is a sharded checkpoint
// of them (no gather), re-sharded on a resume onto another world size as the weights are.
#include <spdlog/spdlog.h>

#include "train/checkpoint.h"
#include "train/hooks/builtin_hooks.h"
#include "train/hooks/ema.h"
#include "train/runner.h"
#include "train/sharded_checkpoint.h"

namespace tandem::train {
namespace {

constexpr const char* kPrefix = "ema_state_dict.";

class EMAHook : public Hook {
 public:
  EMAHook(double momentum, int64_t interval, bool update_buffers, int64_t begin_iter, int64_t begin_epoch)
      : ema_(momentum, interval), update_buffers_(update_buffers), begin_iter_(begin_iter), begin_epoch_(begin_epoch) {}
  std::string name() const override { return "EMAHook"; }
  int priority() const override { return kNormal; }

  void before_run(Runner& r) override {
    TANDEM_CHECK(begin_epoch_ <= r.max_epochs(), "custom_hooks.EMAHook.begin_epoch must be <= max_epochs (",
                 r.max_epochs(), "), got ", begin_epoch_);
    TANDEM_CHECK(begin_iter_ <= r.max_iters(), "custom_hooks.EMAHook.begin_iter must be <= "
                 "the run's iterations (", r.max_iters(), "), got ", begin_iter_);
    if (!loaded_) ema_.reset(tensors(r));
  }
  void after_train_iter(Runner& r, const IterOutputs&) override {
    const bool started = begin_epoch_ > 0 ? r.epoch() >= begin_epoch_ : r.global_iter() >= begin_iter_;
    if (started)
      ema_.update(tensors(r));
    else
      ema_.copy_from(tensors(r));
  }
  void before_val_epoch(Runner& r) override {
    if (ema_.empty()) return;  // a validation outside train()
    ema_.swap_with(tensors(r));
    swapped_ = true;
  }
  void after_val_epoch(Runner& r, const ValMetrics&) override {
    if (!swapped_) return;
    ema_.swap_with(tensors(r));
    swapped_ = false;
  }
  void gather_for_checkpoint(Runner& r, Checkpoint& c) override {
    if (ema_.empty()) return;
    if (const std::string dir = sharded_save_dir(c); !dir.empty()) {  // SHARDED_STATE_DICT: no gather
      save_sharded(r, dir + "/ema", c);
      return;
    }
    TensorMap own;  // "module.<unit>.flat_param" (shards), "module.<buffer>", "steps"
    ema_.save(own, "");
    std::vector<Tensor> shards;
    for (const auto& [name, t] : r.fsdp()->named_parameters()) shards.push_back(own.at("module." + name));
    for (auto& [name, t] : r.fsdp()->unshard_tensors(shards)) own["module." + name] = t;  // collective
    for (auto& [name, t] : r.fsdp()->named_parameters()) own.erase("module." + name);
    for (auto& [key, t] : own) c.extra[kPrefix + key] = t;
  }
  void before_save_checkpoint(Runner& r, Checkpoint& c) override {
    if (!ema_.empty() && !r.fsdp()) ema_.save(c.extra, kPrefix);  // under FSDP gather_for_checkpoint did
  }
  void after_load_checkpoint(Runner& r, const Checkpoint& c) override {
    if (c.extra.count(std::string(kPrefix) + "steps") == 0) {
      spdlog::warn("EMAHook: the checkpoint has no ema_state_dict; the average starts from its weights");
      return;
    }
    ema_.reset(tensors(r));
    ema_.load(is_sharded(c) ? load_sharded(r, sharded_dir(c) + "/ema", c)
              : r.fsdp()    ? sharded(*r.fsdp(), c.extra)
                            : c.extra,
              kPrefix);
    loaded_ = true;
  }

 private:
  // The averaged tensors: the model's parameters (and buffers); under FSDP this rank's shards of
  // the parameters, then the module's buffers.
  nn::NamedTensors tensors(Runner& r) const {
    if (dist::FullyShardedDataParallel* f = r.fsdp()) {
      nn::NamedTensors out = f->named_parameters();
      if (update_buffers_)
        for (auto& b : f->module().named_buffers()) out.push_back(b);
      return out;
    }
    return update_buffers_ ? r.model().state_dict() : r.model().named_parameters();
  }
  // The averages written as a sharded checkpoint of their own (collective): swapped into the shards
  // (and buffers) while save_sharded writes them; the steps go with the training state.
  void save_sharded(Runner& r, const std::string& dir, Checkpoint& c) {
    const nn::NamedTensors live = tensors(r);
    ema_.swap_with(live);
    try {
      r.fsdp()->save_sharded(dir);
    } catch (...) {
      ema_.swap_with(live);
      throw;
    }
    ema_.swap_with(live);
    TensorMap own;
    ema_.save(own, kPrefix);
    c.extra[std::string(kPrefix) + "steps"] = own.at(std::string(kPrefix) + "steps");
  }
  // Their inverse (collective): the averages loaded into the shards, re-sharded on another world size
  // as the weights are, read out as an ema_state_dict over this rank's shards, and the model's own
  // values put back.
  TensorMap load_sharded(Runner& r, const std::string& dir, const Checkpoint& c) const {
    dist::FullyShardedDataParallel& f = *r.fsdp();
    nn::NamedTensors live = f.named_parameters();
    for (auto& b : f.module().named_buffers()) live.push_back(b);
    std::vector<Tensor> own;
    for (auto& [name, t] : live) own.push_back(t.detach().clone());
    f.load_sharded(dir);
    TensorMap out;
    for (auto& [name, t] : tensors(r)) out[std::string(kPrefix) + "module." + name] = t.detach().clone();
    out[std::string(kPrefix) + "steps"] = c.extra.at(std::string(kPrefix) + "steps");
    for (size_t i = 0; i < live.size(); ++i) live[i].second.detach().copy_(own[i]);
    return out;
  }
  // A checkpoint's full ema_state_dict with the parameters replaced by this rank's shards.
  static TensorMap sharded(dist::FullyShardedDataParallel& f, const TensorMap& extra) {
    const std::string module = std::string(kPrefix) + "module.";
    std::map<std::string, Tensor> full;
    for (const auto& [key, t] : extra)
      if (key.rfind(module, 0) == 0) full[key.substr(module.size())] = t;
    TensorMap out = extra;
    const std::vector<Tensor> shards = f.shard_tensors(full);
    const nn::NamedTensors names = f.named_parameters();
    for (size_t k = 0; k < shards.size(); ++k) out[module + names[k].first] = shards[k];
    return out;
  }
  ExponentialMovingAverage ema_;
  bool update_buffers_;
  int64_t begin_iter_, begin_epoch_;
  bool loaded_ = false, swapped_ = false;
};

}  // namespace

Schema ema_hook_schema() {
  return {arg_string("ema_type", "ExponentialMovingAverage", {"ExponentialMovingAverage"},
                     "the average (the one Tandem has)"),
          below(above(arg_number("momentum", 0.0002, "the new weights' share at each update"), 0), 1),
          at_least(arg_int("interval", 1, "iterations between updates"), 1),
          arg_bool("update_buffers", false, "average the buffers too (else copied)"),
          at_least(arg_int("begin_iter", 0, "first iteration that updates"), 0),
          at_least(arg_int("begin_epoch", 0, "first epoch that updates"), 0),
          arg_bool("strict_load", false, "accepted: loading is always strict here")};
}

std::shared_ptr<Hook> make_ema_hook(const Kwargs& k) {
  const int64_t begin_iter = k.integer("begin_iter"), begin_epoch = k.integer("begin_epoch");
  TANDEM_CHECK(begin_iter == 0 || begin_epoch == 0, k.owner(), ": give begin_iter or begin_epoch, not both");
  return std::make_shared<EMAHook>(k.number("momentum"), k.integer("interval"), k.boolean("update_buffers"),
                                   begin_iter, begin_epoch);
}

}  // namespace tandem::train
