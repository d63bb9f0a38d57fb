// The models library's ResNet and GPT under FullyShardedDataParallel in the trainer, as MMEngine
// spells it through --cfg-options (model_wrapper_cfg.type=MMFullyShardedDataParallel with
// size_based_auto_wrap_policy on the ResNet and transformer_auto_wrap_policy on the GPT's Block),
// 2 ranks under tandem-run, short runs of configs/resnet/resnet20_fashion.json and
// configs/gpt/gpt_char.json:
//   - the per-iteration losses are DDP's: bit for bit for the ResNet (FSDP divides and sums the
//     gradients as the reducer does, in rank order through shared memory); within kClipTolerance for
//     the GPT, whose config clips the gradient norm (see there);
//   - a run killed mid-epoch resumes from its checkpoint with losses bitwise those of an
//     uninterrupted run;
//   - `tandem-test` on the last checkpoint prints the metrics of DDP's checkpoint (the ResNet: both
//     hold rank 0's BatchNorm statistics) and of the run's last validation (the GPT).
// BatchNorm's buffers under FSDP are PyTorch's: not sharded, broadcast from rank 0 once at wrapping,
// then each rank's own (no per-forward broadcast_buffers as DDP's); so rank 1 validates with its own
// statistics and the ResNet's validation may differ from DDP's in the last digits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"
#include "metrics.h"
#include "model_runs.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

// Relative difference allowed between FSDP's and DDP's losses when the gradient norm is clipped
// (optim_wrapper.clip_grad). Its origin: FSDP sums the squares of each rank's shard, then across
// the ranks (as PyTorch's FSDP.clip_grad_norm_), DDP those of each full gradient, so the norm and
// the clip coefficient differ in their last bits. Measured on this GPT run: losses 7.5e-8 apart at
// most over 24 iterations. Without clipping the GPT's losses are DDP's bit for bit, and DDP's own
// losses do not move under another bucket size (bucket_cap_mb=0.01) or over TCP (TANDEM_SHM=0).
constexpr double kClipTolerance = 1e-6;

// The last "eval" record of a --metrics-out file.
nlohmann::json last_eval(const fs::path& file) {
  nlohmann::json out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == "eval") out = j;
  }
  return out;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A run's arguments: its work dir and metrics file named `name` in `tmp`, then `args`.
std::vector<std::string> named(const TempDir& tmp, const std::string& name, const std::vector<std::string>& args) {
  return with({"--work-dir", tmp.file(name), "--metrics-out", tmp.file(name + ".jsonl")}, args);
}

void expect_losses_match(const Losses& ddp, const Losses& fsdp, size_t iterations, double tolerance) {
  ASSERT_EQ(ddp.size(), iterations);
  ASSERT_EQ(fsdp.size(), ddp.size());
  for (const auto& [at, loss] : ddp) {
    if (tolerance == 0)
      EXPECT_EQ(fsdp.at(at), loss) << "epoch " << at.first << " iter " << at.second;
    else
      EXPECT_NEAR(fsdp.at(at), loss, tolerance * std::abs(loss)) << "epoch " << at.first << " iter " << at.second;
  }
}

void expect_bitwise(const Losses& full, const Losses& again) {
  ASSERT_EQ(again.size(), full.size());
  for (const auto& [at, loss] : full) EXPECT_EQ(again.at(at), loss) << "epoch " << at.first << " iter " << at.second;
}

// A killed FSDP run (rank 0 SIGKILLed after the checkpoint of iteration `kill_at`) resumed: its
// losses are `full`'s bit for bit.
void expect_resume_bitwise(const TempDir& tmp, const std::string& config, const std::vector<std::string>& args,
                           int kill_at, const Losses& full) {
  const std::vector<std::string> cut = named(tmp, "cut", args);
  ASSERT_EQ(train_two_ranks(config, with(cut, {"--debug-sigkill-at", std::to_string(kill_at)}), tmp / "cut1.log"), 137)
      << read_file(tmp / "cut1.log");
  ASSERT_EQ(train_two_ranks(config, with(cut, {"--resume"}), tmp / "cut2.log"), 0) << read_file(tmp / "cut2.log");
  EXPECT_NE(read_file(tmp / "cut2.log").find("resumed from"), std::string::npos) << read_file(tmp / "cut2.log");
  expect_bitwise(full, read_losses(tmp / "cut.jsonl"));
}

}  // namespace

TEST(FsdpModels, ResNetTrainsAsDdpResumesBitwiseAndTandemTestPrintsDdpsMetrics) {
  TANDEM_NEED_DATA("/usr/share/datasets/fashion-mnist");
  TempDir tmp("fsdp-resnet");
  const std::string config = kConfigs + "/resnet/resnet20_fashion.json";
  // 1024 samples, 64 a rank a batch: 8 iterations an epoch, 2 epochs, a checkpoint every 4.
  const std::vector<std::string> run = {
      "--cfg-options", "train_dataloader.dataset.indices=1024", "val_dataloader.dataset.indices=256",
      "train_cfg.max_epochs=2", "default_hooks.logger.interval=4",
      R"(default_hooks.checkpoint={"type": "CheckpointHook", "by_epoch": false, "interval": 4, "max_keep_ckpts": 2})"};
  const std::vector<std::string> fsdp = with(run, {
      "model_wrapper_cfg.type=MMFullyShardedDataParallel",
      R"(model_wrapper_cfg.auto_wrap_policy={"type": "size_based_auto_wrap_policy", "min_num_params": 2000})"});
  ASSERT_EQ(train_two_ranks(config, named(tmp, "ddp", run), tmp / "ddp.log"), 0) << read_file(tmp / "ddp.log");
  ASSERT_EQ(train_two_ranks(config, named(tmp, "fsdp", fsdp), tmp / "fsdp.log"), 0) << read_file(tmp / "fsdp.log");
  const std::string log = read_file(tmp / "fsdp.log");
  EXPECT_NE(log.find("fsdp: FULL_SHARD, 13 unit(s)"), std::string::npos) << log;
  const Losses full = read_losses(tmp / "fsdp.jsonl");
  expect_losses_match(read_losses(tmp / "ddp.jsonl"), full, 16, 0.0);
  const double ddp_accuracy = last_eval(tmp / "ddp.jsonl").at("test_accuracy");
  EXPECT_NEAR(last_eval(tmp / "fsdp.jsonl").at("test_accuracy").get<double>(), ddp_accuracy, 0.02)
      << "rank 1 validates with its own BatchNorm statistics under FSDP";
  // Both checkpoints hold the same weights and rank 0's statistics: tandem-test prints the same.
  auto test = [&](const std::string& name) {
    return test_metrics({kTest, config, tmp.file(name + "/iter_16.safetensors"), "--work-dir", tmp.file(name + "-test"),
                         "--cfg-options", "val_dataloader.dataset.indices=256"},
                        tmp / (name + "-test.log"));
  };
  const std::string ddp_metrics = test("ddp"), fsdp_metrics = test("fsdp");
  EXPECT_DOUBLE_EQ(first_value(fsdp_metrics, "accuracy/top1: "), first_value(ddp_metrics, "accuracy/top1: "))
      << fsdp_metrics << "\n" << ddp_metrics;
  EXPECT_DOUBLE_EQ(first_value(fsdp_metrics, "loss: "), first_value(ddp_metrics, "loss: ")) << fsdp_metrics;
  expect_resume_bitwise(tmp, config, fsdp, 6, full);
}

TEST(FsdpModels, GptTrainsAsDdpResumesBitwiseAndTandemTestPrintsTheLastValidation) {
  TANDEM_NEED_DATA_FILE("/usr/share/games/fortunes", "fortunes");
  TempDir tmp("fsdp-gpt");
  const std::string config = kConfigs + "/gpt/gpt_char.json";
  const std::vector<std::string> run = {
      "--cfg-options", "train_cfg.max_iters=24", "train_cfg.val_interval=12", "default_hooks.logger.interval=6",
      "default_hooks.checkpoint.interval=8",
      R"(param_scheduler=[{"type": "LinearLR", "start_factor": 0.1, "by_epoch": false, "begin": 0, "end": 10}])"};
  const std::vector<std::string> fsdp = with(run, {
      "model_wrapper_cfg.type=MMFullyShardedDataParallel",
      R"(model_wrapper_cfg.auto_wrap_policy={"type": "torch.distributed.fsdp.wrap.transformer_auto_wrap_policy", )"
      R"("transformer_layer_cls": ["Block"]})"});
  ASSERT_EQ(train_two_ranks(config, named(tmp, "ddp", run), tmp / "ddp.log"), 0) << read_file(tmp / "ddp.log");
  ASSERT_EQ(train_two_ranks(config, named(tmp, "fsdp", fsdp), tmp / "fsdp.log"), 0) << read_file(tmp / "fsdp.log");
  const std::string log = read_file(tmp / "fsdp.log");
  EXPECT_NE(log.find("fsdp: FULL_SHARD, 3 unit(s)"), std::string::npos) << "two Blocks and the root\n" << log;
  const Losses full = read_losses(tmp / "fsdp.jsonl");
  expect_losses_match(read_losses(tmp / "ddp.jsonl"), full, 24, kClipTolerance);
  const double ddp_val = last_eval(tmp / "ddp.jsonl").at("test_loss");
  const double val = last_eval(tmp / "fsdp.jsonl").at("test_loss");
  EXPECT_NEAR(val, ddp_val, kClipTolerance * ddp_val);
  const std::string metrics = test_metrics(
      {kTest, config, tmp.file("fsdp/iter_24.safetensors"), "--work-dir", tmp.file("fsdp-test")}, tmp / "test.log");
  EXPECT_DOUBLE_EQ(first_value(metrics, "loss: "), last_value(log, "test_loss: ")) << metrics;
  expect_resume_bitwise(tmp, config, fsdp, 12, full);
}
