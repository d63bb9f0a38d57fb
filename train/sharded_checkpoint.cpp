// Sharded checkpoints of the trainer (see sharded_checkpoint.h).
#include "train/sharded_checkpoint.h"

#include <filesystem>

#include "core/error.h"
#include "dist/parallel/fsdp_checkpoint.h"

namespace tandem::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kLoadedKey = "sharded_dir";  // in memory only: where a loaded checkpoint lies
constexpr const char* kSavingKey = "sharded_save_dir";

std::string run_file(const std::string& dir) { return (fs::path(dir) / "run.safetensors").string(); }

std::string strip_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

std::string sharded_checkpoint_name(const std::string& path) {
  const std::string suffix = ".safetensors";
  if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0)
    return path.substr(0, path.size() - suffix.size()) + ".sharded";
  return path + ".sharded";
}

bool is_sharded(const Checkpoint& c) { return c.meta.contains(kLoadedKey); }
std::string sharded_dir(const Checkpoint& c) { return c.meta.value(kLoadedKey, std::string()); }
std::string sharded_save_dir(const Checkpoint& c) { return c.meta.value(kSavingKey, std::string()); }

std::string begin_sharded_save(const std::string& dir, dist::ProcessGroup& group, Checkpoint& c) {
  const std::string tmp = strip_slash(dir) + ".tmp";
  if (group.rank() == 0) {  // a crashed save's leftovers go first
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp);
  }
  group.barrier()->wait(group.timeout());
  c.meta[kSavingKey] = tmp;
  return tmp;
}

void finish_sharded_save(const std::string& tmp, const std::string& dir, const Checkpoint& c) {
  Checkpoint state = c;
  state.weights.clear();
  state.optimizer.clear();
  state.meta.erase(kSavingKey);
  state.meta["state_dict_type"] = "SHARDED_STATE_DICT";
  save_checkpoint(run_file(tmp), state);
  std::error_code ec;
  fs::remove_all(dir, ec);  // the same iteration saved again (a best checkpoint, a stop)
  fs::rename(tmp, dir);
  fsync_dir(fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string());
}

Checkpoint load_sharded_checkpoint(const std::string& path) {
  const std::string dir = strip_slash(path);
  Checkpoint c;
  try {
    dist::verify_sharded_checkpoint(dir);
    c = load_checkpoint(run_file(dir));
    if (fs::is_directory(fs::path(dir) / "ema")) dist::verify_sharded_checkpoint((fs::path(dir) / "ema").string());
  } catch (const CheckpointDamaged& e) {
    throw CheckpointDamaged(dir, e.file(), e.damage());
  } catch (const SafetensorsError& e) {
    throw CheckpointDamaged(dir, e.path(), (e.tensor().empty() ? "" : "tensor '" + e.tensor() + "': ") + e.problem());
  } catch (const Error& e) {
    throw CheckpointDamaged(dir, dir, e.what());
  }
  TANDEM_CHECK(c.meta.value("state_dict_type", "") == "SHARDED_STATE_DICT", "checkpoint '", dir,
               "': its training state does not say SHARDED_STATE_DICT; it is not a sharded checkpoint");
  c.meta[kLoadedKey] = dir;
  return c;
}

void load_weights_or_shards(nn::Module& module, const std::string& path) {
  if (!fs::is_directory(path)) {
    nn::load_weights(module, path);
    return;
  }
  module.load_state_dict(dist::load_sharded_state_dict(strip_slash(path)));
}

}  // namespace tandem::train
