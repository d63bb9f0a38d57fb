// Training checkpoints: what an exact resume needs, in two safetensors files.
//   <name>.safetensors        the model's state_dict (PyTorch names; the
//                             nn::save_weights format, so --init-weights and
//                             PyTorch read it as plain weights)
//   <name>.state.safetensors  "optimizer.<key>" (Optimizer::state_dict),
//                             "scaler.<key>" (AMP GradScaler state) and hooks'
//                             "<what>_state_dict.<key>" tensors, plus
//                             a JSON object (epoch, iteration, RNG, schedule,
//                             data position, config ...) in __metadata__["tandem"]
// Writes are atomic per file (temporary file, fsync, rename; then the directory
// is fsynced); the state file is written first and the weights last, and
// CheckpointManager names a checkpoint in `last_checkpoint` only after both are
// durable, so a failed or interrupted save never removes or corrupts the
// previous good checkpoint. Errors are tandem::Error naming the path.
//
// Damage: both files carry CRC-32C checksums (core/safetensors.h: one per tensor
// and one over the header, which holds the state JSON), so a changed byte, a
// truncation or a zeroed page anywhere in either file is refused on load with
// CheckpointDamaged, one line naming the file, the tensor where there is one and
// what to do. Files written before checksums load unverified, with a notice.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "train/config.h"

namespace tandem::train {

struct Checkpoint {
  TensorMap weights;    // model state_dict
  TensorMap optimizer;  // Optimizer::state_dict()
  TensorMap scaler;     // GradScaler state; empty without AMP
  // Hooks' state under its full names "<what>_state_dict.<key>" (EMAHook's ema_state_dict.*).
  TensorMap extra;
  Json meta = Json::object();
};

// A checkpoint file whose content is wrong. what() is one line: "checkpoint file '<file>' is damaged:
// [tensor '<name>': ]<problem>; resume from an earlier checkpoint (--resume <its path>) or delete this
// one (<both files>)" (or, with no earlier checkpoint beside it, to delete it and start again).
class CheckpointDamaged : public Error {
 public:
  CheckpointDamaged(const std::string& checkpoint, std::string file, std::string damage);
  const std::string& file() const { return file_; }      // the damaged file: the weights or the state
  const std::string& damage() const { return damage_; }  // "[tensor '<name>': ]<problem>"

 private:
  std::string file_, damage_;
};

// foo.safetensors -> foo.state.safetensors
std::string state_path(const std::string& weights_path);

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws naming the file when either file is missing or not a Tandem checkpoint, CheckpointDamaged
// when either file's content is wrong.
Checkpoint load_checkpoint(const std::string& path);

// Writes `content` to `path` atomically (temporary file, fsync, rename, fsync dir).
void write_file_atomic(const std::string& path, const std::string& content);
// fsyncs a directory, so a rename inside it survives a crash.
void fsync_dir(const std::string& dir);

// Checkpoints of one work dir: iter_<global iteration>.safetensors (+ state) or, sharded,
// the directory iter_<global iteration>.sharded (sharded_checkpoint.h),
// the latest named in <dir>/last_checkpoint, at most max_keep kept (0: all).
class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int64_t max_keep);
  // Saves, then points last_checkpoint at it, then removes the oldest beyond
  // max_keep. Returns the weights path.
  std::string save(const Checkpoint& checkpoint, int64_t global_iter);
  // Points last_checkpoint at `path` (a checkpoint already written, e.g. a sharded one's directory),
  // then removes the oldest beyond max_keep.
  void commit(const std::string& path);
  // The checkpoint named by <dir>/last_checkpoint; throws naming the file if there is none.
  static std::string latest(const std::string& dir);
  // Auto resume: the checkpoint latest() names, loaded; when it is damaged or missing, the newest
  // older iter_<n> checkpoint of the directory that loads, after one line through `say` naming the
  // damaged one(s) and the one resumed. Throws when none loads (never an empty result).
  static std::pair<std::string, Checkpoint> load_latest_intact(const std::string& dir,
                                                               const std::function<void(const std::string&)>& say);
  // Weights paths of the iter_<n> checkpoints in the directory, oldest (smallest n) first.
  static std::vector<std::string> list(const std::string& dir);
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int64_t max_keep_;
};

}  // namespace tandem::train
