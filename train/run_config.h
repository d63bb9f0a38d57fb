// A training job's config as one tree in MMEngine's shape (model, model_wrapper_cfg, optim_wrapper,
// param_scheduler, train_cfg, train_dataloader, val_dataloader, default_hooks, env_cfg, ...): the
// one form a setting takes from the user's file to the Runner (Runner::from_config).
//
// Load order: the built-in defaults (the reference MNIST recipe) <- the config file (.json or .py,
// _base_ merged) <- --cfg-options KEY=VALUE <- the command-line flags the user gave (an application's
// alias table of flag -> key path). A file of Tandem's former own shape (top-level train, ddp, data,
// optimizer, schedule, env, amp) is translated into MMEngine keys once, as it is read; a key of that
// shape with no MMEngine counterpart is refused naming the key to use.
//
// complete_run_config checks every key once, where its schema lives: the top-level sections'
// schemas (run_config_schema.cpp) and the registered types' own (Registry::register_module's
// schema), and fills every default in. The completed tree is what <work_dir>/config.json holds.
// Errors are tandem::Error naming the key path as the user wrote it, and the flag or source that
// set it ("--lr (optim_wrapper.optimizer.lr): must be >= 0, got -1").
#pragma once

#include <map>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/registry.h"
#include "train/runner.h"

namespace tandem::train {

// Where a leaf of the tree came from: "--lr", "--cfg-options" or "config 'a.json'"; absent: the defaults.
using Origins = std::map<std::string, std::string>;

// A value a command-line flag sets at a key path.
struct FlagSetting {
  std::string flag;  // "--lr"
  std::string path;  // "optim_wrapper.optimizer.lr"
  Json value;
};

struct LoadedConfig {
  Json tree;  // merged, not yet completed
  Origins origins;
};

// The reference recipe's registered types (MnistNet, Adadelta lr 1.0, StepLR gamma 0.7, MNIST from
// Debian's Fashion-MNIST): the tree every config is merged onto. The sections' other defaults are
// their schemas'.
Json default_run_config();

// `tree` merged onto `defaults` (MMEngine's _base_ rule); a registered type's dict that names another
// type than the default's replaces it whole (the default's keywords belong to the default's type).
Json merge_onto_defaults(const Json& defaults, const Json& tree);

// defaults <- file ("" for none) <- cfg_options <- flags, with the origin of every value set.
LoadedConfig load_run_config(const std::string& file, const std::vector<std::string>& cfg_options,
                             const std::vector<FlagSetting>& flags);

// True for a top-level key complete_run_config reads (MMEngine's keys Tandem honours or accepts).
bool is_run_config_key(const std::string& top_level_key);
// True for a top-level key of Tandem's former own shape (train, ddp, data, optimizer, ...).
bool is_own_schema_key(const std::string& top_level_key);
// `tree` with its former own-shape keys translated into the MMEngine keys they stand for (its
// MMEngine keys kept as they are); `source` names it in errors.
Json translate_own_schema(const Json& tree, const std::string& source);
// The registered optimizer a lower-case name stands for ("sgd" -> "SGD"; adadelta, sgd, adam, adamw),
// as --optimizer and the former own shape spell it; "" for another name.
std::string registered_optimizer_name(const std::string& lower);

// `tree` checked (every section and registered type against its schema) with every default filled in.
Json complete_run_config(const Json& tree, const Origins& origins = {});

// Kwargs of the dict at `path` (all its keys but "type"), owner `path`, with the origins under it.
Kwargs kwargs_at(const Json& dict, const std::string& path, const Origins& origins);
// The error label of `path` as Kwargs::label words it ("config key 'a.b'", "--lr (a.b):").
std::string key_label(const std::string& path, const Origins& origins);

// The sections' schemas, by key path ("train_cfg", "env_cfg.dist_cfg", "" for the top-level scalars).
const std::vector<std::pair<std::string, Schema>>& run_config_sections();

// RunnerOptions of `tree` (completed first): every setting read from its MMEngine key, the datasets
// built from train_dataloader.dataset and val_dataloader.dataset, config_json the completed tree.
RunnerOptions runner_options_from_config(const Json& tree, const Origins& origins = {});
// Runner::from_config for a tree already parsed and merged onto the defaults.
std::unique_ptr<Runner> runner_from_config(const Json& tree, const Origins& origins = {});

}  // namespace tandem::train
