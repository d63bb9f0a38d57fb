// The Runner's checkpoints: what save_checkpoint writes (train/checkpoint.h's two files, with the
// training state in the metadata) and how a run resumes from one or starts from given weights.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "core/random.h"
#include "data/data_loader.h"
#include "data/distributed_sampler.h"
#include "dist/parallel/zero_redundancy_optimizer.h"
#include "train/checkpoint.h"
#include "train/runner.h"
#include "train/runner_internal.h"
#include "train/sharded_checkpoint.h"

namespace tandem::train {
namespace {

// The schedule's types, comma-separated ("LinearLR,MultiStepLR"; one type alone as before lists).
std::string scheduler_types(const RunnerOptions& o) {
  std::string out;
  for (const SchedulerSpec& s : scheduler_specs(o)) out += (out.empty() ? "" : ",") + s.type;
  for (const auto& [name, specs] : o.param_scheduler_dict)  // several optimizers: "gen:StepLR"
    for (const SchedulerSpec& s : specs) out += (out.empty() ? "" : ",") + name + ":" + s.type;
  return out;
}

// What a resumed run must share with the checkpoint's run, whatever its config looks like.
Json identity(const RunnerOptions& o, int64_t train_samples) {
  return {{"model", o.model_instance ? "(instance)" : o.model},
          {"optimizer", o.optimizer},
          {"param_scheduler", scheduler_types(o)},
          {"batch_size", o.batch_size},
          {"shuffle", o.shuffle},
          {"seed", o.seed},
          {"train_samples", train_samples},
          {"accumulative_counts", o.accumulative_counts}};
}

void check_resumable(const Checkpoint& c, const std::string& path, const RunnerOptions& o, const Json& now_id,
                     int world, int64_t iters) {
  const int saved_world = c.meta.at("world_size").get<int>();
  const Json saved = c.meta.value("config", Json::object());
  const Json now = o.config_json.empty() ? Json::object() : Json::parse(o.config_json);
  for (const std::string& key : o.resume_keys) {
    if (!saved.is_object() || !saved.contains(key.substr(0, key.find('.')))) continue;  // an older config's shape
    std::string pointer = "/" + key;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    const Json::json_pointer at(pointer);  // an absent key reads as null
    const Json then_v = saved.contains(at) ? saved.at(at) : Json();
    const Json now_v = now.contains(at) ? now.at(at) : Json();
    TANDEM_CHECK(then_v == now_v, "checkpoint '", path, "' was written with ", key, " = ", then_v.dump(),
                 " but this run has ", now_v.dump(), "; resume with the checkpoint's config");
  }
  if (c.meta.contains("runner"))
    for (const auto& [key, value] : now_id.items()) {
      const Json then_v = c.meta["runner"].value(key, Json());
      TANDEM_CHECK(then_v == value, "checkpoint '", path, "' was written with ", key, " = ", then_v.dump(),
                   " but this run has ", value.dump(), "; resume with the checkpoint's settings");
    }
  if (saved_world != world && o.reshard_resume) return;  // its epoch is re-sharded (reshard_epoch)
  TANDEM_CHECK(saved_world == world, "checkpoint '", path, "' was written by ", saved_world,
               " rank(s) but this run has ", world,
               "; resume with the same number of ranks, or let the rest of its epoch be re-sharded over this run's "
               "ranks (tandem-mnist --resume-reshard; automatic when tandem-run restarted the workers)");
  const int64_t saved_iters = c.meta.at("iters_per_epoch").get<int64_t>();
  TANDEM_CHECK(saved_iters == iters, "checkpoint '", path, "' has ", saved_iters,
               " iterations per epoch but this run has ", iters, "; resume with the same data and batch size");
}

}  // namespace

std::string Runner::save_checkpoint(int64_t epoch, int64_t done, const std::string& path, int64_t max_keep) {
  Checkpoint c;
  CheckpointManager checkpoints(o_.work_dir, max_keep >= 0 ? max_keep : o_.max_keep_ckpts);
  std::string sharded, tmp;  // SHARDED_STATE_DICT: the checkpoint's directory, the one it is written in
  if (fsdp_ && fsdp_sharded_state_dict(o_.model_wrapper_args)) {
    // Collective, no gather: each rank writes its shards and the optimizer state over them, the
    // hooks theirs (EMAHook's averages), then rank 0 the training state below.
    sharded = sharded_checkpoint_name(
        path.empty() ? o_.work_dir + "/iter_" + std::to_string(global_iter_) + ".safetensors" : path);
    tmp = begin_sharded_save(sharded, *dist_->group, c);
    fsdp_->save_sharded(tmp, &optimizer());
    call_hooks([&](Hook& h) { h.gather_for_checkpoint(*this, c); });
  } else if (fsdp_) {
    // Collective: the module's own weights gathered and the optimizer state unsharded, so that the
    // checkpoint is an ordinary one (tandem-test, load_from) and resumes on any world size.
    for (auto& [name, t] : fsdp_->full_state_dict()) c.weights[name] = t;
    c.optimizer = fsdp_->full_optimizer_state(optimizer());
    call_hooks([&](Hook& h) { h.gather_for_checkpoint(*this, c); });
  }
  if (auto* zero = dynamic_cast<dist::ZeroRedundancyOptimizer*>(&optimizer()))
    zero->consolidate_state_dict(0);  // collective: every rank's shard of the state on rank 0
  if (env_.rank != 0) {
    if (!sharded.empty()) dist_->group->barrier()->wait(dist_->group->timeout());  // rank 0 renamed it
    return "";
  }
  if (!fsdp_) {
    for (auto& [name, t] : net_->state_dict()) c.weights[name] = t;
    save_optim_state(c);
  } else if (scaler().enabled()) {
    c.scaler = scaler().state_dict();
  }
  c.meta = {{"epoch", epoch},
            {"iter", done},
            {"global_iter", global_iter_},
            {"iters_per_epoch", iters_},
            {"world_size", world_},
            {"rng", default_generator().state()},
            {"schedule", {{"type", scheduler_types(o_)}, {"state", Json(schedulers_.state_dict())}}},
            {"sampler", {{"epoch", sampler_epoch_}, {"batches_done", done}, {"seed", o_.seed}, {"shuffle", o_.shuffle},
                         {"offset", done > 0 ? epoch_offset_ : 0}}},
            {"amp", o_.amp},
            {"runner", identity(o_, o_.train_dataset->size())},
            {"config", o_.config_json.empty() ? Json::object() : Json::parse(o_.config_json)}};
  call_hooks([&](Hook& h) { h.before_save_checkpoint(*this, c); });
  std::string written = path;
  if (!sharded.empty()) {
    finish_sharded_save(tmp, sharded, c);
    if (path.empty()) checkpoints.commit(sharded);
    dist_->group->barrier()->wait(dist_->group->timeout());
    written = sharded;
  } else if (written.empty()) {
    written = checkpoints.save(c, global_iter_);
  } else {
    train::save_checkpoint(written, c);
  }
  spdlog::info("checkpoint saved: {} (epoch {}, {} of {} iterations done, global iteration {})", written, epoch, done,
               iters_, global_iter_);
  return written;
}

void Runner::load_resume_checkpoint() {
  if (resume_path_.empty()) return;
  if (o_.resume == "auto") {  // the newest intact checkpoint of the work dir, saying which were skipped
    auto [path, checkpoint] = CheckpointManager::load_latest_intact(o_.work_dir, [&](const std::string& line) {
      if (env_.rank == 0) spdlog::warn("{}", line);
    });
    resume_path_ = path;
    resume_ckpt_ = std::make_unique<Checkpoint>(std::move(checkpoint));
  } else if (std::filesystem::is_directory(resume_path_)) {
    resume_ckpt_ = std::make_unique<Checkpoint>(load_sharded_checkpoint(resume_path_));
  } else {
    resume_ckpt_ = std::make_unique<Checkpoint>(load_checkpoint(resume_path_));
  }
  check_resumable(*resume_ckpt_, resume_path_, o_, identity(o_, o_.train_dataset->size()), world_, iters_);
}

void Runner::resume_or_load() {
  if (!resume_ckpt_) return;
  const Checkpoint c = std::move(*resume_ckpt_);
  resume_ckpt_.reset();
  try {
    if (is_sharded(c)) {  // collective: this rank's shards and optimizer state, re-sharded on another world size
      TANDEM_CHECK(fsdp_ != nullptr, "it is a sharded checkpoint (SHARDED_STATE_DICT, one file per rank); resume it "
                   "with model_wrapper_cfg.type=MMFullyShardedDataParallel (on any number of ranks), or start "
                   "from its weights with load_from=", sharded_dir(c));
      fsdp_->load_sharded(sharded_dir(c), &optimizer());
    } else if (fsdp_) {
      optimizer().load_state_dict(fsdp_->shard_optimizer_state(c.optimizer));
    }
    if (fsdp_ && scaler().enabled() && !c.scaler.empty()) scaler().load_state_dict(c.scaler);
    if (!fsdp_) load_optim_state(c);
    const auto sched = c.meta.at("schedule").at("state").get<std::map<std::string, double>>();
    schedulers_.load_state_dict(sched);
    default_generator().set_state(c.meta.at("rng").get<std::string>());
    start_epoch_ = c.meta.at("epoch").get<int64_t>();
    skip_ = c.meta.at("iter").get<int64_t>();
    global_iter_ = c.meta.at("global_iter").get<int64_t>();
    reshard_epoch(c);
    call_hooks([&](Hook& h) { h.after_load_checkpoint(*this, c); });
  } catch (const Error& e) {
    TANDEM_FAIL("checkpoint '", resume_path_, "': ", e.what());
  } catch (const nlohmann::json::exception& e) {
    TANDEM_FAIL("checkpoint '", resume_path_, "': bad training state: ", e.what());
  }
  if (o_.accumulative_counts > 1 && global_iter_ % o_.accumulative_counts != 0)
    spdlog::warn("resuming inside an accumulation group (global iteration {}, accumulative_counts {}): the "
                 "gradients accumulated before the checkpoint are not in it", global_iter_, o_.accumulative_counts);
  spdlog::info("resumed from {}: epoch {}, {} of {} iterations done (global iteration {})", resume_path_, start_epoch_,
               skip_, iters_, global_iter_);
}

void Runner::reshard_epoch(const Checkpoint& c) {
  const int saved_world = c.meta.at("world_size").get<int>();
  const Json sampler = c.meta.value("sampler", Json::object());
  const int64_t saved_offset = sampler.value("offset", int64_t{0});
  const int64_t n = o_.train_dataset->size();
  if (saved_world == world_) {
    epoch_offset_ = saved_offset;  // 0 but after a re-sharded resume: the same sharding goes on
  } else {
    // Positions 0 .. iter x batch x ranks of the epoch's common order were visited (all batches before a
    // mid-epoch checkpoint are full); the rest is dealt out anew over this run's ranks.
    epoch_offset_ = std::min(n, saved_offset + skip_ * o_.batch_size * saved_world);
    skip_ = 0;
  }
  if (epoch_offset_ == 0 && saved_world == world_) return;
  auto dist_sampler = std::dynamic_pointer_cast<data::DistributedSampler>(train_sampler_);
  if (!dist_sampler) {  // one rank now: the same order as a DistributedSampler of one replica
    dist_sampler = std::make_shared<data::DistributedSampler>(n, 1, 0, o_.shuffle, o_.seed, false, o_.pad);
    train_sampler_ = dist_sampler;
    train_loader_ = std::make_unique<data::DataLoader>(o_.train_dataset, train_sampler_, o_.batch_size);
  }
  dist_sampler->resume_epoch_after(start_epoch_ - 1, epoch_offset_);
  if (saved_world != world_) {
    dist_sampler->set_epoch(start_epoch_ - 1);
    spdlog::info("world size changed from {} to {}: resuming epoch {} after {} of its {} samples; the {} left are "
                 "sharded over {} rank(s), {} iteration(s) each (global iteration {})",
                 saved_world, world_, start_epoch_, epoch_offset_, n, n - epoch_offset_, world_,
                 train_loader_->num_batches(), global_iter_);
  }
}

}  // namespace tandem::train
