// MMEngine-shaped configs for tandem-mnist: the keys an MMEngine user writes (model,
// model_wrapper_cfg, optim_wrapper, param_scheduler, train_cfg, val_cfg, default_hooks,
// custom_hooks, env_cfg, dist_params, auto_scale_lr, randomness, train_dataloader,
// val_dataloader, visualizer, launcher, work_dir, load_from, resume, compile) translated onto tandem-mnist's
// own config tree (config.h), one key at a time; docs/training.md lists every mapping. A key or
// value Tandem cannot honour is an error naming it and what is supported, never silently dropped.
#pragma once

#include <set>
#include <string>

#include "train/config.h"

namespace tandem::app {

// True for a top-level key of MMEngine's shape that tandem-mnist's own tree does not have.
bool is_mmengine_key(const std::string& top_level_key);
// Those keys, sorted.
const std::set<std::string>& mmengine_keys();
// `message` with each quoted tandem-mnist key that the user's MMEngine tree `mm` set through a
// direct translation named as the user wrote it ('train.epochs' -> 'train_cfg.max_epochs').
std::string in_mmengine_terms(const std::string& message, const train::Json& mm);
// The tandem-mnist keys `mm` sets (a partial tree, to merge onto the defaults); `mm` holds only
// MMEngine keys (and model / work_dir / load_from). `source` names the file in errors.
train::Json translate_mmengine(const train::Json& mm, const std::string& source);

}  // namespace tandem::app
