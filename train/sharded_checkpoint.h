// The trainer's sharded checkpoints under FullyShardedDataParallel
// (model_wrapper_cfg.state_dict_type='SHARDED_STATE_DICT'): a directory iter_<n>.sharded/ holding
//   fsdp.json, shard-<rank>-of-<world>.safetensors   FullyShardedDataParallel::save_sharded: each rank's
//                                                   shards, the optimizer's state over them, its buffers
//   ema/ (with an EMAHook)                          the averages, sharded the same way
//   run.safetensors, run.state.safetensors          rank 0's training state as checkpoint.h's two files
//                                                   (the weights file is empty: the weights are the shards)
// It is written under iter_<n>.sharded.tmp/ and renamed when every file is in, so the name appears
// only for a whole checkpoint. Loading verifies every file's CRC-32Cs on every rank, so all ranks take
// the same decision when one is damaged.
#pragma once

#include <string>

#include "dist/group/process_group.h"
#include "nn/module.h"
#include "train/checkpoint.h"

namespace tandem::train {

// The checkpoint kind's name for a full checkpoint's path: <name>.safetensors -> <name>.sharded.
std::string sharded_checkpoint_name(const std::string& path);
// Whether `c` was loaded from a sharded checkpoint; sharded_dir(c) is then its directory.
bool is_sharded(const Checkpoint& c);
std::string sharded_dir(const Checkpoint& c);
// Where hooks write their shards during a save (Hook::gather_for_checkpoint, on every rank): the
// checkpoint's temporary directory, "" for a full checkpoint.
std::string sharded_save_dir(const Checkpoint& c);

// Collective over `group`: makes <dir>.tmp/ (rank 0, emptied first) and returns its path once every
// rank can write into it; `c` is marked as a sharded save into it.
std::string begin_sharded_save(const std::string& dir, dist::ProcessGroup& group, Checkpoint& c);
// Rank 0, once every rank's files are in `tmp`: writes the training state, renames `tmp` to `dir`.
void finish_sharded_save(const std::string& tmp, const std::string& dir, const Checkpoint& c);

// Reads a sharded checkpoint's training state after checking every file of it; a damaged or missing
// file throws CheckpointDamaged naming it (so that auto resume takes an older checkpoint).
Checkpoint load_sharded_checkpoint(const std::string& dir);

// load_from / tandem-test: a safetensors weights file, or a sharded checkpoint's directory whose
// shards are assembled in this process into the module's full state dict.
void load_weights_or_shards(nn::Module& module, const std::string& path);

}  // namespace tandem::train
