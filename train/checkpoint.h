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
#pragma once

#include <cstdint>
#include <string>
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

// foo.safetensors -> foo.state.safetensors
std::string state_path(const std::string& weights_path);

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws naming the file when either file is missing or not a Tandem checkpoint.
Checkpoint load_checkpoint(const std::string& path);

// Writes `content` to `path` atomically (temporary file, fsync, rename, fsync dir).
void write_file_atomic(const std::string& path, const std::string& content);
// fsyncs a directory, so a rename inside it survives a crash.
void fsync_dir(const std::string& dir);

// Checkpoints of one work dir: iter_<global iteration>.safetensors (+ state),
// the latest named in <dir>/last_checkpoint, at most max_keep kept (0: all).
class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int64_t max_keep);
  // Saves, then points last_checkpoint at it, then removes the oldest beyond
  // max_keep. Returns the weights path.
  std::string save(const Checkpoint& checkpoint, int64_t global_iter);
  // The checkpoint named by <dir>/last_checkpoint; throws naming the file if there is none.
  static std::string latest(const std::string& dir);
  // Weights paths of the iter_<n> checkpoints in the directory, oldest (smallest n) first.
  static std::vector<std::string> list(const std::string& dir);
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int64_t max_keep_;
};

}  // namespace tandem::train
