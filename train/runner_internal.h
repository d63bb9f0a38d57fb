// Pieces of the Runner shared by its source files and hooks (internal, not installed: it names
// nlohmann::json through train/config.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/group/process_group.h"
#include "dist/store/store.h"
#include "train/config.h"
#include "train/runner.h"

namespace tandem::train {

// The job's place in a distributed run; inactive (no group) without a launcher (launcher none).
struct Distributed {
  std::shared_ptr<dist::Store> store;
  std::shared_ptr<dist::ProcessGroup> group;
  // The per-iteration stop agreement's group: `group` itself when it is Gloo, else a Gloo group
  // beside NCCL, so that agreeing never waits for the GPU.
  std::shared_ptr<dist::ProcessGroup> host_group;
  bool active() const { return group != nullptr; }
};

// Adds a log file to the default logger (the same lines as the console).
void log_to_file(const std::string& file);
// Why the CUDA-graph step cannot run with these options ("" when it can), naming config keys.
// `world`: the launcher's world size (any launcher but none means DDP, even with one rank).
std::string cuda_graph_refusal(const RunnerOptions& o, const Device& device, int world);
// The default hooks for RunnerOptions' plain settings (MMEngine's default_hooks + Tandem's).
std::vector<HookSpec> default_hook_specs(const RunnerOptions& o);
// The schedule's entries: param_schedulers, else the one param_scheduler (none when it is "").
std::vector<SchedulerSpec> scheduler_specs(const RunnerOptions& o);
// model_wrapper_cfg's checkpoint kind under MMFullyShardedDataParallel: true for SHARDED_STATE_DICT
// (state_dict_type, or MMEngine's state_dict_cfg), false for FULL_STATE_DICT; throws naming the
// accepted values for anything else (fsdp_wrapper.cpp).
bool fsdp_sharded_state_dict(const Kwargs& k);
// "m:ss" style ETA: H:MM:SS.
std::string format_eta(double seconds);

}  // namespace tandem::train
