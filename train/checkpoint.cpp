// Checkpoint files (see checkpoint.h). POSIX file calls for the fsyncs; the
// tensor files go through save_safetensors, which is itself atomic per file and
// checksums every tensor and the header; loading turns a file's damage into
// CheckpointDamaged, and auto resume skips damaged checkpoints for older ones.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "train/sharded_checkpoint.h"

namespace tandem::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kMetaKey = "tandem";
constexpr const char* kFormat = "tandem-checkpoint-1";

// A hook's tensor: "<what>_state_dict.<key>" (MMEngine's ema_state_dict, ...).
bool is_hook_state(const std::string& key) {
  const size_t at = key.find("_state_dict.");
  return at != std::string::npos && at > 0 && key.find('.') == at + 11 && key.size() > at + 12;
}

std::string parent_dir(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

// n of ".../iter_<n>.safetensors", -1 for another name.
int64_t iter_of(const std::string& path) {
  static const std::regex name(R"(iter_(\d{1,18})\.(safetensors|sharded))");
  std::smatch m;
  const std::string file = fs::path(path).filename().string();
  return std::regex_match(file, m, name) ? std::stoll(m[1].str()) : -1;
}

// The checkpoints of `dir` older than `checkpoint` (all others when its name has no iteration), oldest first.
std::vector<std::string> earlier_checkpoints(const std::string& dir, const std::string& checkpoint) {
  const int64_t n = iter_of(checkpoint);
  const fs::path own = fs::path(checkpoint).filename();
  std::vector<std::string> out;
  for (const std::string& p : CheckpointManager::list(dir))  // oldest first
    if (n < 0 ? fs::path(p).filename() != own : iter_of(p) < n) out.push_back(p);
  return out;
}

// What to do about a damaged checkpoint: the newest earlier one beside it, or starting again.
std::string advice(const std::string& checkpoint) {
  const std::vector<std::string> earlier = earlier_checkpoints(parent_dir(checkpoint), checkpoint);
  const std::string files = fs::is_directory(checkpoint) ? fs::path(checkpoint).filename().string() + "/"
                            : fs::path(checkpoint).filename().string() + " and " +
                                  fs::path(state_path(checkpoint)).filename().string();
  if (!earlier.empty())
    return "resume from an earlier checkpoint (--resume " + earlier.back() + ") or delete this one (" + files + ")";
  return "no earlier checkpoint is beside it: delete it (" + files + ") and start the run again without --resume";
}

Checkpoint read_checkpoint(const std::string& path, const std::string& sp) {
  Checkpoint c;
  c.weights = load_safetensors(path);
  SafetensorsFile state = load_safetensors_file(sp);  // the tensors and the metadata in one read
  const auto& md = state.metadata;
  auto it = md.find(kMetaKey);
  TANDEM_CHECK(it != md.end(), "checkpoint state '", sp, "' has no \"", kMetaKey, "\" metadata");
  c.meta = Json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!c.meta.is_object() || c.meta.value("format", "") != kFormat)
    throw CheckpointDamaged(path, sp, std::string("its training state (__metadata__ \"") + kMetaKey + "\") is not a " +
                                          kFormat + " JSON object");
  for (auto& [k, t] : state.tensors) {
    if (k.rfind("optimizer.", 0) == 0)
      c.optimizer[k.substr(10)] = t;
    else if (k.rfind("scaler.", 0) == 0)
      c.scaler[k.substr(7)] = t;
    else if (is_hook_state(k))
      c.extra[k] = t;
    else
      TANDEM_FAIL("checkpoint state '", sp, "': unexpected tensor '", k,
                  "' (expected optimizer.*, scaler.* or <what>_state_dict.*)");
  }
  return c;
}

}  // namespace

CheckpointDamaged::CheckpointDamaged(const std::string& checkpoint, std::string file, std::string damage)
    : Error("checkpoint file '" + file + "' is damaged: " + damage + "; " + advice(checkpoint)),
      file_(std::move(file)),
      damage_(std::move(damage)) {}

std::string state_path(const std::string& weights_path) {
  const std::string suffix = ".safetensors";
  if (weights_path.size() > suffix.size() &&
      weights_path.compare(weights_path.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weights_path.substr(0, weights_path.size() - suffix.size()) + ".state" + suffix;
  return weights_path + ".state";
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  TANDEM_CHECK(fd >= 0, "cannot open directory '", dir, "' to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TANDEM_CHECK(rc == 0, "fsync of directory '", dir, "' failed: ", std::strerror(err));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK(fd >= 0, "cannot write '", path, "': cannot create '", tmp, "': ", std::strerror(errno));
  size_t done = 0;
  int err = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    TANDEM_FAIL("cannot write '", path, "': ", std::strerror(err));
  }
  fsync_dir(parent_dir(path));
}

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  TensorMap state;
  for (const auto& [k, t] : c.optimizer) state["optimizer." + k] = t;
  for (const auto& [k, t] : c.scaler) state["scaler." + k] = t;
  for (const auto& [k, t] : c.extra) {
    TANDEM_CHECK(is_hook_state(k), "checkpoint '", path, "': extra state '", k, "' must be named <what>_state_dict.<key>");
    state[k] = t;
  }
  Json meta = c.meta;
  meta["format"] = kFormat;
  const std::string sp = state_path(path);
  save_safetensors(sp, state, {{kMetaKey, meta.dump()}});
  try {
    save_safetensors(path, c.weights);
  } catch (...) {
    // Only the new state file can be removed here: `path` itself was not replaced.
    std::error_code ec;
    fs::remove(sp, ec);
    throw;
  }
  fsync_dir(parent_dir(path));
}

Checkpoint load_checkpoint(const std::string& path) {
  TANDEM_CHECK(fs::exists(path), "checkpoint '", path, "' does not exist");
  const std::string sp = state_path(path);
  TANDEM_CHECK(fs::exists(sp), "checkpoint '", path, "' has no training state: '", sp,
               "' is missing (plain weights load with --init-weights, not --resume)");
  try {
    return read_checkpoint(path, sp);
  } catch (const SafetensorsError& e) {
    const std::string tensor = e.tensor().empty() ? "" : "tensor '" + e.tensor() + "': ";
    throw CheckpointDamaged(path, e.path(), tensor + e.problem());
  }
}

CheckpointManager::CheckpointManager(std::string dir, int64_t max_keep) : dir_(std::move(dir)), max_keep_(max_keep) {
  TANDEM_CHECK(max_keep_ >= 0, "max_keep_ckpts must be >= 0 (0 keeps all), got ", max_keep_);
}

std::vector<std::string> CheckpointManager::list(const std::string& dir) {
  static const std::regex name(R"(iter_(\d+)\.(safetensors|sharded))");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (std::regex_match(file, m, name)) found.emplace_back(std::stoll(m[1].str()), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::string CheckpointManager::save(const Checkpoint& c, int64_t global_iter) {
  const std::string path = (fs::path(dir_) / ("iter_" + std::to_string(global_iter) + ".safetensors")).string();
  save_checkpoint(path, c);
  commit(path);
  return path;
}

void CheckpointManager::commit(const std::string& path) {
  write_file_atomic((fs::path(dir_) / "last_checkpoint").string(), fs::absolute(path).string() + "\n");
  if (max_keep_ > 0) {
    std::vector<std::string> all = list(dir_);
    all.erase(std::remove(all.begin(), all.end(), path), all.end());
    const int64_t extra = static_cast<int64_t>(all.size()) + 1 - max_keep_;
    for (int64_t i = 0; i < extra; ++i) {
      std::error_code ec;
      fs::remove(state_path(all[static_cast<size_t>(i)]), ec);
      fs::remove_all(all[static_cast<size_t>(i)], ec);  // a sharded checkpoint is a directory
    }
  }
}

std::string CheckpointManager::latest(const std::string& dir) {
  const std::string pointer = (fs::path(dir) / "last_checkpoint").string();
  std::ifstream in(pointer);
  TANDEM_CHECK(in.good(), "--resume: no checkpoint to resume from: '", pointer,
               "' does not exist (give a checkpoint path, or the --work-dir of the run)");
  std::string path;
  std::getline(in, path);
  TANDEM_CHECK(!path.empty(), "--resume: '", pointer, "' is empty");
  return path;
}

std::pair<std::string, Checkpoint> CheckpointManager::load_latest_intact(
    const std::string& dir, const std::function<void(const std::string&)>& say) {
  const std::string newest = latest(dir);
  std::vector<std::string> candidates = {newest};
  const std::vector<std::string> earlier = earlier_checkpoints(dir, newest);
  candidates.insert(candidates.end(), earlier.rbegin(), earlier.rend());  // newest first
  std::string skipped;  // "'<file>' is damaged (<why>); '<file>' is missing"
  auto skip = [&](const std::string& what) { skipped += (skipped.empty() ? "" : "; ") + what; };
  for (const std::string& c : candidates) {
    const bool sharded = fs::is_directory(c);
    if (!sharded && (!fs::exists(c) || !fs::exists(state_path(c)))) {
      skip("'" + (fs::exists(c) ? state_path(c) : c) + "' is missing");
      continue;
    }
    try {
      Checkpoint checkpoint = sharded ? load_sharded_checkpoint(c) : load_checkpoint(c);
      if (!skipped.empty()) say("resuming from " + c + ", the newest intact checkpoint in " + dir + ": " + skipped);
      return {c, std::move(checkpoint)};
    } catch (const CheckpointDamaged& e) {
      skip("'" + e.file() + "' is damaged (" + e.damage() + ")");
    }
  }
  TANDEM_FAIL("--resume: no intact checkpoint in '", dir, "': ", skipped,
              "; start the run again without --resume (from scratch), or resume another run's checkpoint");
}

}  // namespace tandem::train
