// Damaged checkpoints (checkpoints carry CRC-32C checksums, train/checkpoint.h). For both files of a
// checkpoint (the weights and the state): a byte flipped in each region (the JSON header's tensor
// entries, each tensor's data, the metadata: the checksum table, and the state file's training-state
// JSON), truncation at ten points spread over the file, and each 4096-byte page zeroed. Every case is
// refused by load_checkpoint with one line naming the file and what to do, and auto resume
// (CheckpointManager::load_latest_intact) falls back to the previous intact checkpoint, whose
// content it returns, saying so in one line. Then real tandem-mnist runs: an explicit --resume of
// a damaged checkpoint fails in one line, --resume alone falls back and trains on from the intact
// one, with none intact it fails without training, a checkpoint without checksums resumes with a
// notice per file, and resuming a finished run says so.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "fault/fault_util.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using namespace tandem;
using namespace tandem::test;

namespace {

void write_bytes(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

Tensor iota(Shape shape, float start) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + 0.25f * static_cast<float>(i % 97) + 1.f;
  return Tensor::from_vector<float>(v, shape);
}

// A checkpoint big enough for several 4096-byte pages in each file, no byte of its data zero-filled.
train::Checkpoint sample(float start) {
  train::Checkpoint c;
  c.weights["fc1.weight"] = iota({32, 40}, start);
  c.weights["fc1.bias"] = iota({32}, start);
  c.weights["fc2.weight"] = iota({10, 32}, start);
  c.optimizer["state.0.square_avg"] = iota({32, 40}, start + 1);
  c.optimizer["state.0.step"] = Tensor::scalar(7, kInt64);
  c.optimizer["state.1.square_avg"] = iota({10, 32}, start + 2);
  c.meta = {{"epoch", 2}, {"iter", 5}, {"rng", "1 2 3"}};
  return c;
}

// The JSON header's length: the file's first 8 bytes, little-endian.
uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  return n;
}

// Checkpoints of iterations 5 and 10 in a temporary work dir, as CheckpointManager writes them.
struct TwoCheckpoints {
  TempDir tmp{"damage"};
  std::string dir = tmp.path().string(), older, newest;
  TwoCheckpoints() {
    train::CheckpointManager manager(dir, 0);
    older = manager.save(sample(0.f), 5);
    newest = manager.save(sample(100.f), 10);
  }
};

// Auto resume in `dir` (CheckpointManager::load_latest_intact); the lines it says go to `said`.
std::pair<std::string, train::Checkpoint> auto_resume(const std::string& dir, std::vector<std::string>* said) {
  return train::CheckpointManager::load_latest_intact(dir, [said](const std::string& s) { said->push_back(s); });
}

struct Damage {
  std::string what;   // for failure messages
  std::string bytes;  // the damaged file
};

// Every damage the brief names, for one safetensors file's bytes.
std::vector<Damage> damages(const std::string& bytes) {
  std::vector<Damage> out;
  const uint64_t n = header_length(bytes);
  const std::string header = bytes.substr(8, n);
  const nlohmann::json h = nlohmann::json::parse(header.substr(0, header.find_last_not_of(' ') + 1));
  auto flip = [&](const std::string& what, size_t at, uint8_t bit) {
    std::string b = bytes;
    b[at] = static_cast<char>(static_cast<uint8_t>(b[at]) ^ bit);
    out.push_back({what + " (byte " + std::to_string(at) + ")", b});
  };
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const size_t entry = header.find("\"" + it.key() + "\":{");
    flip("header: name of '" + it.key() + "'", 8 + entry + 1, 0x01);
    flip("header: shape of '" + it.key() + "'", 8 + header.find("\"shape\":[", entry) + 9, 0x01);
    flip("header: data_offsets of '" + it.key() + "'", 8 + header.find("\"data_offsets\":[", entry) + 16, 0x01);
    const auto offsets = it.value().at("data_offsets");
    const size_t begin = offsets[0].get<size_t>(), end = offsets[1].get<size_t>();
    flip("data of '" + it.key() + "'", 8 + n + begin + (end - begin) / 2, 0x40);
    flip("data of '" + it.key() + "', last byte", 8 + n + end - 1, 0x01);
  }
  flip("metadata: checksum table key", 8 + header.find("tandem.crc32c") + 3, 0x01);
  const size_t table = header.find("tandem.crc32c");
  flip("metadata: a tensor's CRC", 8 + header.find("\\\":\\\"", header.find("\"fc", table)) + 5, 0x01);
  flip("metadata: the header's CRC", 8 + header.find("__header__") + 16, 0x01);
  if (const size_t state = header.find("epoch\\\":2"); state != std::string::npos)
    flip("metadata: the training-state JSON's epoch", 8 + state + 8, 0x01);
  if (const size_t state = header.find("rng\\\":"); state != std::string::npos)
    flip("metadata: the training-state JSON's rng", 8 + state + 8, 0x01);
  for (int k = 0; k < 10; ++k) {
    const size_t len = bytes.size() * static_cast<size_t>(k) / 10 + (k > 0 ? 3 : 0);
    out.push_back({"truncated to " + std::to_string(len) + " of " + std::to_string(bytes.size()) + " bytes",
                   bytes.substr(0, len)});
  }
  for (size_t page = 0; page < bytes.size(); page += 4096) {
    std::string b = bytes;
    std::fill(b.begin() + static_cast<std::ptrdiff_t>(page),
              b.begin() + static_cast<std::ptrdiff_t>(std::min(b.size(), page + 4096)), '\0');
    out.push_back({"page at " + std::to_string(page) + " zeroed", b});
  }
  return out;
}

std::vector<std::string> trainer(const fs::path& work_dir, const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {kTrainer, "--data-dir", kDigits, "--limit", "640", "--test-limit", "64",
                                   "--threads", "1", "--checkpoint-interval", "5", "--log-interval", "5",
                                   "--work-dir", work_dir.string()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

// Runs tandem-mnist to its end (60 s at most); its exit code and output.
std::pair<int, std::string> run_trainer(const fs::path& work_dir, const std::vector<std::string>& flags,
                                        const fs::path& log) {
  Process p(trainer(work_dir, flags), log);
  const auto rc = p.wait_for(seconds(60));
  return {rc.value_or(-1), p.output()};
}

// The line of `out` that holds `part` ("" when none).
std::string line_with(const std::string& out, const std::string& part) {
  const size_t at = out.find(part);
  if (at == std::string::npos) return "";
  const size_t begin = out.rfind('\n', at) == std::string::npos ? 0 : out.rfind('\n', at) + 1;
  return out.substr(begin, out.find('\n', at) - begin);
}

// A file as written before checksums: the same header without the "tandem.crc32c" entry.
void strip_checksums(const fs::path& p) {
  const std::string bytes = read_file(p);
  const uint64_t n = header_length(bytes);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  h["__metadata__"].erase("tandem.crc32c");
  if (h["__metadata__"].empty()) h.erase("__metadata__");
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(uint64_t(text.size()) >> (8 * i));
  write_bytes(p, len + text + bytes.substr(8 + n));
}

// One epoch of tandem-mnist in a temporary work dir: checkpoints of iterations 5 and 10.
struct FirstRun {
  TempDir tmp{"damage"};
  fs::path w = tmp / "w";
  int rc = -1;
  std::string out;
  FirstRun() { std::tie(rc, out) = run_trainer(w, {"--epochs", "1"}, tmp / "first.log"); }
};

}  // namespace

TEST(CheckpointDamage, EveryDamageToEitherFileIsRefusedAndAutoResumeFallsBack) {
  const TwoCheckpoints c;
  const std::string &older = c.older, &newest = c.newest;
  int cases = 0;
  for (const std::string& file : {newest, train::state_path(newest)}) {
    const std::string good = read_file(file);
    const std::vector<Damage> all = damages(good);
    ASSERT_GE(all.size(), 25u);
    for (const Damage& d : all) {
      SCOPED_TRACE(file + ": " + d.what);
      ++cases;
      write_bytes(file, d.bytes);
      // Named explicitly: refused in one line naming the damaged file and what to do.
      std::string msg;
      try {
        train::load_checkpoint(newest);
        ADD_FAILURE() << "loaded";
      } catch (const train::CheckpointDamaged& e) {
        msg = e.what();
        EXPECT_EQ(e.file(), file);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not CheckpointDamaged: " << e.what();
      }
      EXPECT_HAS(msg, "checkpoint file '" + file + "' is damaged: ");
      EXPECT_HAS(msg, "; resume from an earlier checkpoint (--resume " + older + ") or delete this one");
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      // Auto resume: the intact checkpoint of iteration 5, its own content, and one line saying so.
      std::vector<std::string> said;
      auto [path, loaded] = auto_resume(c.dir, &said);
      EXPECT_EQ(path, older);
      EXPECT_EQ(loaded.weights.at("fc1.weight").to_vector<float>(),
                sample(0.f).weights.at("fc1.weight").to_vector<float>());
      ASSERT_EQ(said.size(), 1u);
      EXPECT_HAS(said[0], "resuming from " + older + ", the newest intact checkpoint in ");
      EXPECT_HAS(said[0], "'" + file + "' is damaged (");
      EXPECT_EQ(said[0].find('\n'), std::string::npos) << said[0];
    }
    write_bytes(file, good);
  }
  EXPECT_GE(cases, 60);
  // Intact again: it loads, and auto resume takes it without a word.
  std::vector<std::string> said;
  EXPECT_EQ(auto_resume(c.dir, &said).first, newest);
  EXPECT_TRUE(said.empty());
}

TEST(CheckpointDamage, NoIntactCheckpointFailsNamingEachDamagedOne) {
  const TwoCheckpoints c;
  const std::string &older = c.older, &newest = c.newest;
  for (const std::string& p : {newest, older}) {
    std::string b = read_file(p);
    b.resize(b.size() / 2);
    write_bytes(p, b);
  }
  std::vector<std::string> said;
  const std::string msg = error_of([&] { auto_resume(c.dir, &said); });
  EXPECT_HAS(msg, "--resume: no intact checkpoint in '" + c.dir + "': '" + newest + "' is damaged (");
  EXPECT_HAS(msg, "; '" + older + "' is damaged (");
  EXPECT_HAS(msg, "start the run again without --resume");
  // With no earlier checkpoint beside it, the advice is to start again.
  EXPECT_HAS(error_of([&] { train::load_checkpoint(older); }),
             "no earlier checkpoint is beside it: delete it (iter_5.safetensors and iter_5.state.safetensors)");
}

TEST(CheckpointDamage, ADeletedNewestCheckpointFallsBackToTheOlderOne) {
  const TwoCheckpoints c;
  const std::string& newest = c.newest;
  fs::remove(newest);
  std::vector<std::string> said;
  const std::string path = auto_resume(c.dir, &said).first;
  EXPECT_EQ(path, c.older);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_HAS(said[0], "'" + newest + "' is missing");
}

TEST(CheckpointDamage, TrainerRefusesADamagedCheckpointOrFallsBackUnderAutoResume) {
  TANDEM_NEED_DATA(kDigits);
  const FirstRun first;
  ASSERT_EQ(first.rc, 0) << first.out;
  const fs::path& w = first.w;
  const fs::path newest = w / "iter_10.safetensors", older = w / "iter_5.safetensors";
  // One bit of fc2.bias's first float: before checksums this resumed and trained on a huge bias.
  std::string bytes = read_file(newest);
  const uint64_t n = header_length(bytes);
  const auto h = nlohmann::json::parse(bytes.substr(8, n));
  bytes[8 + n + h.at("fc2.bias").at("data_offsets")[0].get<size_t>() + 3] ^= 0x40;
  write_bytes(newest, bytes);

  auto [rc1, out1] =
      run_trainer(first.tmp / "w1", {"--epochs", "2", "--resume", newest.string()}, first.tmp / "explicit.log");
  EXPECT_EQ(rc1, 1) << out1;
  const std::string error = line_with(out1, "tandem-mnist: error: ");
  EXPECT_HAS(error, "checkpoint file '" + newest.string() + "' is damaged: tensor 'fc2.bias': its data fails its "
                    "CRC-32C check (stored ");
  EXPECT_HAS(error, "resume from an earlier checkpoint (--resume " + older.string() + ") or delete this one");
  EXPECT_EQ(out1.find("Epoch(train)"), std::string::npos) << out1;  // nothing trained on it

  auto [rc2, out2] = run_trainer(w, {"--epochs", "2", "--resume"}, first.tmp / "auto.log");
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_HAS(line_with(out2, "the newest intact checkpoint"),
             "resuming from " + older.string() + ", the newest intact checkpoint in " + w.string() + ": '" +
                 newest.string() + "' is damaged (tensor 'fc2.bias': its data fails its CRC-32C check");
  EXPECT_HAS(out2, "resumed from " + older.string() + ": epoch 1, 5 of 10 iterations done");
  EXPECT_HAS(out2, "Epoch(test) [2]");

  // Both damaged: the run fails, naming them, and trains nothing.
  for (const fs::path& p : {w / "iter_5.safetensors", w / "iter_10.safetensors", w / "iter_15.safetensors",
                            w / "iter_20.safetensors"})
    if (fs::exists(p)) fs::resize_file(train::state_path(p.string()), 100);
  auto [rc3, out3] = run_trainer(w, {"--epochs", "3", "--resume"}, first.tmp / "none.log");
  EXPECT_EQ(rc3, 1) << out3;
  EXPECT_HAS(line_with(out3, "tandem-mnist: error: "), "--resume: no intact checkpoint in '" + w.string() + "'");
  EXPECT_EQ(out3.find("Epoch(train)"), std::string::npos) << out3;
}

TEST(CheckpointDamage, TrainerResumesACheckpointWithoutChecksumsWithANoticePerFile) {
  TANDEM_NEED_DATA(kDigits);
  const FirstRun first;
  ASSERT_EQ(first.rc, 0) << first.out;
  const fs::path& w = first.w;
  const fs::path ckpt = w / "iter_5.safetensors";
  strip_checksums(ckpt);
  strip_checksums(train::state_path(ckpt.string()));
  auto [rc, out] = run_trainer(first.tmp / "w2", {"--epochs", "1", "--resume", ckpt.string()}, first.tmp / "old.log");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_HAS(out, "resumed from " + ckpt.string() + ": epoch 1, 5 of 10 iterations done");
  for (const std::string& file : {ckpt.string(), train::state_path(ckpt.string())}) {
    const std::string notice = "safetensors file '" + file + "' carries no CRC-32C checksums";
    const size_t first = out.find(notice);
    EXPECT_NE(first, std::string::npos) << out;
    EXPECT_EQ(out.find(notice, first + 1), std::string::npos) << "twice: " << out;
  }
}

TEST(CheckpointDamage, ResumingAFinishedRunSaysWhereItsLastCheckpointIs) {
  TANDEM_NEED_DATA(kDigits);
  const FirstRun first;
  ASSERT_EQ(first.rc, 0) << first.out;
  const fs::path& w = first.w;
  auto [rc, out] = run_trainer(w, {"--epochs", "1", "--resume"}, first.tmp / "again.log");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_HAS(out, "the run is finished: its last checkpoint, " + (w / "iter_10.safetensors").string() +
                      ", is at global iteration 10 of 10; nothing is left to train (to train longer, raise "
                      "train_cfg.max_epochs (--epochs) and resume)");
  EXPECT_EQ(out.find("Epoch(train)"), std::string::npos) << out;
}
