// Exact resume of tandem-mnist: a run stopped mid-epoch (SIGKILL after a
// checkpoint, or SIGTERM, which saves a checkpoint at the next iteration
// boundary and exits 143) and resumed with --resume logs per-iteration losses
// bitwise equal to an uninterrupted run's, in one process and with 2 ranks
// under tandem-run (Gloo on loopback). Also: bad checkpoints and a diverging
// loss end with one clear error line.
// Robustness: runs use 640 training samples (10 iterations an epoch), 1 thread
// per process, and deterministic stop points (--debug-sigterm-at/-sigkill-at,
// test hooks raising the signal in rank 0 after that global iteration), except
// the external-signal tests, which wait for progress before signalling and
// skip if the run finished first.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/process.h"
#include "metrics.h"
#include "common/require_data.h"
#include "common/test_util.h"
#include "core/safetensors.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {


void expect_same_losses(const Losses& want, const Losses& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [at, loss] : want) {
    auto it = got.find(at);
    ASSERT_NE(it, got.end()) << "epoch " << at.first << " iter " << at.second << " missing";
    EXPECT_EQ(it->second, loss) << "epoch " << at.first << " iter " << at.second;  // bitwise
  }
}

// The common flags: `epochs` epochs of 640 samples, a checkpoint every `every` iterations.
std::vector<std::string> flags(const TempDir& tmp, const std::string& name, std::vector<std::string> extra = {},
                               int epochs = 3, int every = 4) {
  std::vector<std::string> f = {"--data-dir", kDigits, "--epochs", std::to_string(epochs), "--limit", "640",
                                "--test-limit", "256", "--threads", "1", "--log-interval", "5",
                                "--checkpoint-interval", std::to_string(every), "--work-dir", tmp.file(name),
                                "--metrics-out", tmp.file(name + ".jsonl")};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

std::vector<std::string> one(std::vector<std::string> f) {
  f.insert(f.begin(), kTrainer);
  return f;
}

std::vector<std::string> two(std::vector<std::string> f) {
  std::vector<std::string> argv = {kRun, "--standalone", "--nproc-per-node", "2", "--grace-period", "60",
                                   kTrainer, "--launcher", "pytorch", "--device", "cpu", "--dist-timeout", "120"};
  argv.insert(argv.end(), f.begin(), f.end());
  return argv;
}

// Runs to completion, then stops part-way and resumes; compares the losses.
void check_resume(bool two_ranks, const std::string& stop_flag, int stop_at, int expected_stop_rc,
                  const std::vector<std::string>& extra = {}) {
  TempDir tmp("resume");
  auto cmd = [&](std::vector<std::string> f) {
    f.insert(f.end(), extra.begin(), extra.end());
    return two_ranks ? two(std::move(f)) : one(std::move(f));
  };
  ASSERT_EQ(run_process(cmd(flags(tmp, "full")), tmp / "full.log"), 0) << read_file(tmp / "full.log");
  const int rc = run_process(cmd(flags(tmp, "cut", {stop_flag, std::to_string(stop_at)})), tmp / "cut1.log");
  ASSERT_EQ(rc, expected_stop_rc) << read_file(tmp / "cut1.log");
  const std::string latest = read_file(tmp / "cut" / "last_checkpoint");
  ASSERT_FALSE(latest.empty()) << read_file(tmp / "cut1.log");
  if (stop_flag == "--debug-sigterm-at") {
    // SIGTERM: the checkpoint is at the very iteration the signal arrived.
    EXPECT_NE(latest.find("iter_" + std::to_string(stop_at) + ".safetensors"), std::string::npos) << latest;
    EXPECT_NE(read_file(tmp / "cut1.log").find("stopped by signal 15 (SIGTERM)"), std::string::npos);
  }
  ASSERT_EQ(run_process(cmd(flags(tmp, "cut", {"--resume"})), tmp / "cut2.log"), 0) << read_file(tmp / "cut2.log");
  EXPECT_NE(read_file(tmp / "cut2.log").find("resumed from"), std::string::npos) << read_file(tmp / "cut2.log");
  const Losses full = read_losses(tmp / "full.jsonl");
  EXPECT_EQ(full.size(), two_ranks ? 15u : 30u);  // 3 epochs of 640 samples in batches of 64 per rank
  expect_same_losses(full, read_losses(tmp / "cut.jsonl"));
}

// Waits until `file` has `n` lines or the process ended; true if it has them.
bool wait_for_lines(const fs::path& file, size_t n, Process& p) {
  auto has_them = [&] { return lines_in(read_file(file)) >= n; };
  if (eventually([&] { return has_them() || !p.running(); }, seconds(180)) && has_them()) return true;
  if (p.running())
    ADD_FAILURE() << "no " << n << " lines in " << file << " after 180 s";
  else
    ADD_FAILURE() << "the process ended (status " << *p.status() << ") before writing " << n << " lines to " << file;
  return false;
}

}  // namespace

// tandem-run --max-restarts 1: rank 0 is killed after global iteration 7 (checkpoint iter_4 the
// latest); the restarted group resumes from it by itself (TORCHELASTIC_RESTART_COUNT), and the
// run ends with losses and weights bitwise those of an uninterrupted run.
TEST(Resume, RestartedWorkerGroupResumesFromTheLastCheckpointByItself) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("restart");
  auto with_restarts = [](std::vector<std::string> argv) {
    argv.insert(argv.begin() + 1, {"--max-restarts", "1"});
    return argv;
  };
  ASSERT_EQ(run_process(two(flags(tmp, "full", {"--save-weights", tmp.file("full.safetensors")})), tmp / "full.log"), 0)
      << read_file(tmp / "full.log");
  const auto cut = with_restarts(two(flags(tmp, "cut", {"--debug-sigkill-at", "7", "--save-weights",
                                                        tmp.file("cut.safetensors")})));
  ASSERT_EQ(run_process(cut, tmp / "cut.log"), 0) << read_file(tmp / "cut.log");
  const std::string log = read_file(tmp / "cut.log");
  EXPECT_NE(log.find("restart 1 of the worker group: resuming from the last checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  expect_same_losses(read_losses(tmp / "full.jsonl"), read_losses(tmp / "cut.jsonl"));
  // What it cost: the 7 iterations before the kill, then from the checkpoint (after 4 or 5) to 15;
  // a restart from scratch would log 7 + 15 (the file kept) or 15 (the file truncated).
  int train_lines = 0;
  std::ifstream metrics(tmp / "cut.jsonl");
  for (std::string line; std::getline(metrics, line);)
    train_lines += line.find("\"type\":\"train\"") != std::string::npos;
  EXPECT_GE(train_lines, 7 + 15 - 5);
  EXPECT_LE(train_lines, 7 + 15 - 4);
  const auto a = tandem::load_safetensors(tmp.file("full.safetensors")),
             b = tandem::load_safetensors(tmp.file("cut.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(std::string(static_cast<const char*>(t.raw_data()), t.nbytes()),
              std::string(static_cast<const char*>(b.at(name).raw_data()), b.at(name).nbytes()))
        << name;
  }
}

TEST(Resume, OneProcessSigkillMidEpochResumesBitwise) {
  TANDEM_NEED_DATA(kDigits);
  // Killed after global iteration 14 (epoch 2, iteration 4: checkpoint iter_12
  // is the latest), so the resumed run skips 2 batches of epoch 2 and repeats 2 iterations.
  check_resume(false, "--debug-sigkill-at", 14, 137);
}

TEST(Resume, OneProcessSigtermSavesAtTheNextIterationAndExits143) {
  TANDEM_NEED_DATA(kDigits);
  check_resume(false, "--debug-sigterm-at", 17, 143);
}

TEST(Resume, TwoRanksSigkillMidEpochResumesBitwise) {
  TANDEM_NEED_DATA(kDigits);
  // 2 ranks x 64: 5 iterations an epoch; killed at global iteration 7 (epoch 2, iteration 2).
  check_resume(true, "--debug-sigkill-at", 7, 137);
}

TEST(Resume, TwoRanksAgreeOnTheStopIterationAfterSigtermOnOneRank) {
  TANDEM_NEED_DATA(kDigits);
  // Only rank 0 receives SIGTERM; both stop after the same iteration (8), rank 0 saves, both exit 143.
  check_resume(true, "--debug-sigterm-at", 8, 143);
}

TEST(Resume, OneProcessFp16WithLossScalerResumesBitwise) {
  TANDEM_NEED_DATA(kDigits);
  // The GradScaler's scale and growth tracker travel in the checkpoint.
  check_resume(false, "--debug-sigterm-at", 13, 143, {"--amp", "fp16", "--lr-schedule", "cosine"});
}

TEST(Resume, TwoRanksSyncBnBucketViewsCosineResumeBitwise) {
  TANDEM_NEED_DATA(kDigits);
  check_resume(true, "--debug-sigkill-at", 11, 137,
               {"--sync-bn", "--gradient-as-bucket-view", "--lr-schedule", "cosine"});
}

TEST(Resume, ExternalSigtermToTandemRunStopsBothRanksResumably) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("resume");
  // Every rank holds after iteration 2 until the signal comes: it lands mid-run on any machine.
  Process run(two(flags(tmp, "cut", {"--debug-hold-at", "2"}, 6, 0)), tmp / "cut1.log");
  ASSERT_TRUE(run.started());
  if (!wait_for_lines(tmp / "cut.jsonl", 2, run)) FAIL() << read_file(tmp / "cut1.log");
  ::kill(run.pid(), SIGTERM);
  const int rc = run.finish(kRunLimit).value_or(-1);
  ASSERT_NE(read_file(tmp / "cut1.log").find("stopped by signal 15 (SIGTERM)"), std::string::npos)
      << "rc " << rc << "\n" << read_file(tmp / "cut1.log");
  ASSERT_TRUE(fs::exists(tmp / "cut" / "last_checkpoint")) << read_file(tmp / "cut1.log");
  ASSERT_EQ(run_process(two(flags(tmp, "cut", {"--resume"}, 6, 0)), tmp / "cut2.log"), 0)
      << read_file(tmp / "cut2.log");
  ASSERT_EQ(run_process(two(flags(tmp, "full", {}, 6, 0)), tmp / "full.log"),
            0)
      << read_file(tmp / "full.log");
  const Losses full = read_losses(tmp / "full.jsonl");
  EXPECT_EQ(full.size(), 30u);
  expect_same_losses(full, read_losses(tmp / "cut.jsonl"));
}

TEST(Resume, ExternalSigintToOneProcessExits130) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("resume");
  Process run(one(flags(tmp, "cut", {"--debug-hold-at", "2"}, 20, 0)), tmp / "cut1.log");
  ASSERT_TRUE(run.started());
  if (!wait_for_lines(tmp / "cut.jsonl", 2, run)) FAIL() << read_file(tmp / "cut1.log");
  ::kill(run.pid(), SIGINT);
  const int rc = run.finish(kRunLimit).value_or(-1);
  EXPECT_EQ(rc, 130) << read_file(tmp / "cut1.log");
  const std::string log = read_file(tmp / "cut1.log");
  EXPECT_NE(log.find("stopped by signal 2 (SIGINT)"), std::string::npos) << log;
  EXPECT_NE(log.find("checkpoint saved"), std::string::npos) << log;
  // The checkpoint names the iteration the metrics file ended at.
  const std::string latest = read_file(tmp / "cut" / "last_checkpoint");
  const size_t done = read_losses(tmp / "cut.jsonl").size();
  EXPECT_NE(latest.find("iter_" + std::to_string(done) + ".safetensors"), std::string::npos) << latest;
}

// ---- errors ----

namespace {

// Writes a 1-process checkpoint after 4 iterations into tmp/"w"; returns its path.
std::string make_checkpoint(const TempDir& tmp) {
  EXPECT_EQ(run_process(one(flags(tmp, "w", {"--debug-sigterm-at", "4"}, 1)), tmp / "w.log"), 143)
      << read_file(tmp / "w.log");
  std::string p = read_file(tmp / "w" / "last_checkpoint");
  while (!p.empty() && p.back() == '\n') p.pop_back();
  return p;
}

// The trainer's error line among its other output names `needle`.
void expect_trainer_error(const std::string& out, const std::string& needle) {
  EXPECT_NE(out.find(needle), std::string::npos) << "output: " << out;
  EXPECT_NE(out.find("tandem-mnist: error: "), std::string::npos) << out;
}

}  // namespace

TEST(ResumeErrors, ConfigMismatchNamesTheKey) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("resume");
  const std::string ckpt = make_checkpoint(tmp);
  EXPECT_EQ(run_process(one(flags(tmp, "w", {"--resume", ckpt, "--batch-size", "32"})), tmp / "log"), 1);
  expect_trainer_error(read_file(tmp / "log"), "train_dataloader.batch_size = 64 but this run has 32");
  EXPECT_EQ(run_process(one(flags(tmp, "w", {"--resume", ckpt, "--optimizer", "sgd"})), tmp / "log"), 1);
  expect_trainer_error(read_file(tmp / "log"), "optim_wrapper.optimizer.type = \"Adadelta\" but this run has \"SGD\"");
}

TEST(ResumeErrors, MissingOrMisshapenTensorNamesIt) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("resume");
  const std::string ckpt = make_checkpoint(tmp);
  auto weights = tandem::load_safetensors(ckpt);
  weights.erase("fc2.bias");
  tandem::save_safetensors(ckpt, weights);
  EXPECT_EQ(run_process(one(flags(tmp, "w", {"--resume", ckpt})), tmp / "log"), 1);
  std::string log = read_file(tmp / "log");
  expect_trainer_error(log, ckpt);
  EXPECT_NE(log.find("fc2.bias"), std::string::npos) << log;
  weights["fc2.bias"] = tandem::Tensor::zeros({3});
  tandem::save_safetensors(ckpt, weights);
  EXPECT_EQ(run_process(one(flags(tmp, "w", {"--resume", ckpt})), tmp / "log"), 1);
  log = read_file(tmp / "log");
  expect_trainer_error(log, "fc2.bias");
  EXPECT_NE(log.find("[3]"), std::string::npos) << log;
}

TEST(ResumeErrors, NothingToResumeSaysWhere) {
  TempDir tmp("resume");
  EXPECT_EQ(run_process({kTrainer, "--data-dir", kDigits, "--work-dir", tmp.file("empty"), "--resume"},
                        tmp / "log"),
            1);
  expect_trainer_error(read_file(tmp / "log"), "no checkpoint to resume from");
  EXPECT_EQ(run_process({kTrainer, "--data-dir", kDigits, "--work-dir", tmp.file("empty"), "--resume",
                         tmp.file("nope.safetensors")},
                        tmp / "log"),
            1);
  expect_trainer_error(read_file(tmp / "log"), "nope.safetensors' does not exist");
}

TEST(TrainerStops, NonFiniteLossNamesEpochAndIteration) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("resume");
  EXPECT_EQ(run_process(one(flags(tmp, "nan", {"--optimizer", "sgd", "--lr", "1e300"})), tmp / "log"), 1);
  expect_trainer_error(read_file(tmp / "log"), "the loss is nan at epoch 1, iteration 2/10");
}
