// tandem-mnist's configs and work dir, end to end: precedence (defaults <
// --config < --cfg-options < flags the user gave), the reference recipe in
// configs/ equal to the defaults, every shipped config valid, config errors as
// one line with exit code 2, and the work dir's contents (config.json in MMEngine's
// shape, text log with the console's lines, metrics, checkpoints kept to max_keep_ckpts).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace tandem::test;

namespace {

const std::string kConfigs = TANDEM_SOURCE_DIR "/configs";

// Runs argv in directory `cwd` with stdout+stderr to `log`; returns the exit status.
int run_in(const fs::path& cwd, const std::vector<std::string>& argv, const fs::path& log) {
  return run_process(Spawn{.argv = argv, .out = log, .cwd = cwd, .own_group = true});
}

json print_config(const TempDir& tmp, std::vector<std::string> args) {
  args.insert(args.begin(), kTrainer);
  args.push_back("--print-config");
  const int rc = run_process(args, tmp / "print.log");
  EXPECT_EQ(rc, 0) << read_file(tmp / "print.log");
  return json::parse(read_file(tmp / "print.log"), nullptr, false);
}

}  // namespace

// A file of Tandem's former own shape is read through one translation into MMEngine's keys; the
// printed config is MMEngine's tree with every default filled in.
TEST(Config, PrecedenceIsDefaultsThenFileThenCfgOptionsThenGivenFlags) {
  TempDir tmp("config");
  std::ofstream(tmp / "my.json") << R"({"optimizer": {"lr": 0.5, "type": "sgd"}, "train": {"epochs": 4,
      "log_interval": 9}, "ddp": {"bucket_cap_mb": 5}})";
  json c = print_config(tmp, {"--config", tmp.file("my.json")});
  EXPECT_EQ(c["optim_wrapper"]["optimizer"]["lr"], 0.5);
  EXPECT_EQ(c["optim_wrapper"]["optimizer"]["type"], "SGD");
  EXPECT_EQ(c["train_cfg"]["max_epochs"], 4);
  EXPECT_EQ(c["model_wrapper_cfg"]["bucket_cap_mb"], 5.0);
  EXPECT_EQ(c["train_dataloader"]["batch_size"], 64) << "keys the file does not name keep the defaults";
  c = print_config(tmp, {"--config", tmp.file("my.json"), "--cfg-options", "optim_wrapper.optimizer.lr=0.25",
                         "train.log_interval=7", "--epochs", "1"});
  EXPECT_EQ(c["optim_wrapper"]["optimizer"]["lr"], 0.25);
  EXPECT_EQ(c["default_hooks"]["logger"]["interval"], 7) << "a former own-shape key in --cfg-options is translated";
  EXPECT_EQ(c["train_cfg"]["max_epochs"], 1) << "a given flag beats the file";
  c = print_config(tmp, {"--config", tmp.file("my.json"), "--cfg-options", "optim_wrapper.optimizer.lr=0.25", "--lr",
                         "2"});
  EXPECT_EQ(c["optim_wrapper"]["optimizer"]["lr"], 2.0) << "a given flag beats --cfg-options";
  EXPECT_EQ(c["train_cfg"]["max_epochs"], 4) << "flags not given do not reset the file's values";
  c = print_config(tmp, {"--config", tmp.file("my.json"), "--no-shuffle", "--find-unused-parameters"});
  EXPECT_EQ(c["train_dataloader"]["sampler"]["shuffle"], false);
  EXPECT_EQ(c["model_wrapper_cfg"]["find_unused_parameters"], true);
}

TEST(Config, ReferenceRecipeIsTheDefaultAndEveryShippedConfigIsValid) {
  TempDir tmp("config");
  json defaults = print_config(tmp, {});
  json recipe = print_config(tmp, {"--config", kConfigs + "/mnist_adadelta.json"});
  EXPECT_EQ(defaults["work_dir"], "work_dirs/mnist");
  EXPECT_EQ(recipe["work_dir"], "work_dirs/mnist_adadelta");
  defaults.erase("work_dir");
  recipe.erase("work_dir");
  EXPECT_EQ(recipe, defaults);
  EXPECT_EQ(defaults["optim_wrapper"]["optimizer"]["type"], "Adadelta");
  EXPECT_EQ(defaults["optim_wrapper"]["optimizer"]["lr"], 1.0);
  EXPECT_EQ(defaults["train_dataloader"]["batch_size"], 64);
  EXPECT_EQ(defaults["param_scheduler"][0]["gamma"], 0.7);
  int n = 0;
  for (const auto& e : fs::directory_iterator(kConfigs)) {
    if (e.path().extension() != ".json") continue;
    ++n;
    const json c = print_config(tmp, {"--config", e.path().string()});
    EXPECT_TRUE(c.is_object()) << e.path();
  }
  EXPECT_GE(n, 5);
  const json cosine = print_config(tmp, {"--config", kConfigs + "/mnist_adadelta_cosine_1ep.json"});
  EXPECT_EQ(cosine["param_scheduler"].size(), 1u);
  EXPECT_EQ(cosine["param_scheduler"][0]["type"], "CosineAnnealingLR");
  EXPECT_FALSE(cosine["param_scheduler"][0].contains("gamma")) << "StepLR's keywords do not leak into another type";
  const json bf16 = print_config(tmp, {"--config", kConfigs + "/mnist_bf16.json"});
  EXPECT_EQ(bf16["optim_wrapper"]["type"], "AmpOptimWrapper");
  EXPECT_EQ(bf16["optim_wrapper"]["dtype"], "bfloat16");
}

TEST(ConfigErrors, UnknownKeyWrongTypeBadValueBadFile) {
  TempDir tmp("config");
  std::ofstream(tmp / "typo.json") << R"({"optimizer": {"weight_decay": 0.1, "momentun": 0.9}})";
  EXPECT_EQ(run_process({kTrainer, "--config", tmp.file("typo.json")}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"),
                        "unknown config key 'optimizer.momentun' (did you mean 'optimizer.momentum'?)");
  std::ofstream(tmp / "type.json") << R"({"train_dataloader": {"batch_size": "64"}})";
  EXPECT_EQ(run_process({kTrainer, "--config", tmp.file("type.json")}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"),
                        "config key 'train_dataloader.batch_size' must be an integer >= 1, got \"64\"");
  EXPECT_EQ(run_process({kTrainer, "--cfg-options", "schedule.type=linear"}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "'schedule.type' (now param_scheduler) must be one of step, cosine, "
                                                "list; got \"linear\"");
  EXPECT_EQ(run_process({kTrainer, "--cfg-options", "train_dataloader.batch_size=0"}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "--cfg-options: config key 'train_dataloader.batch_size' must be >= "
                                                "1, got 0");
  EXPECT_EQ(run_process({kTrainer, "--batch-size", "0"}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "--batch-size (train_dataloader.batch_size): must be >= 1, got 0");
  std::ofstream(tmp / "bad.json") << "{\"train\": ";
  EXPECT_EQ(run_process({kTrainer, "--config", tmp.file("bad.json")}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "bad.json' is not valid JSON");
  EXPECT_EQ(run_process({kTrainer, "--config", tmp.file("missing.json")}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "cannot read config file");
}

TEST(WorkDir, DefaultsToWorkDirsConfigNameAndHoldsLogsMetricsConfigAndCheckpoints) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("config");
  std::ofstream(tmp / "tiny.json") << R"({"data": {"limit": 640, "test_limit": 256}, "train": {"epochs": 1,
      "log_interval": 5, "checkpoint_interval_iters": 2, "max_keep_ckpts": 2}, "env": {"threads": 1}})";
  const int rc = run_in(tmp.path(), {kTrainer, "--config", "tiny.json", "--data-dir", kDigits, "--metrics-out",
                                     "m.jsonl"},
                        tmp / "console.log");
  ASSERT_EQ(rc, 0) << read_file(tmp / "console.log");
  const fs::path wd = tmp / "work_dirs" / "tiny";
  ASSERT_TRUE(fs::is_directory(wd)) << read_file(tmp / "console.log");
  // config.json: the completed config in MMEngine's shape, with the work dir filled in.
  const json c = json::parse(read_file(wd / "config.json"));
  EXPECT_EQ(c["train_dataloader"]["dataset"]["indices"], 640);
  EXPECT_EQ(c["train_dataloader"]["dataset"]["data_root"], kDigits);
  EXPECT_EQ(c["val_dataloader"]["dataset"]["indices"], 256);
  EXPECT_EQ(c["work_dir"], "work_dirs/tiny");
  // One <YYYYmmdd_HHMMSS>.log with the console's lines, one metrics file equal to --metrics-out.
  fs::path log, metrics;
  for (const auto& e : fs::directory_iterator(wd)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 19 && name.substr(15) == ".log") log = e.path();
    if (name.size() == 29 && name.substr(15) == ".metrics.jsonl") metrics = e.path();
  }
  ASSERT_FALSE(log.empty()) << "no <timestamp>.log in " << wd;
  ASSERT_FALSE(metrics.empty()) << "no <timestamp>.metrics.jsonl in " << wd;
  const std::string console = read_file(tmp / "console.log"), text = read_file(log);
  for (const char* line : {"Epoch(train) [1][5/10]", "Epoch(train) [1][10/10]", "Epoch(test) [1]",
                           "checkpoint saved"}) {
    EXPECT_NE(console.find(line), std::string::npos) << console;
    EXPECT_NE(text.find(line), std::string::npos) << text;
  }
  EXPECT_EQ(read_file(metrics), read_file(tmp / "m.jsonl"));
  // Checkpoints every 2 iterations and at the epoch's end; 2 kept; the pointer names the newest.
  EXPECT_TRUE(fs::exists(wd / "iter_10.safetensors"));
  EXPECT_TRUE(fs::exists(wd / "iter_10.state.safetensors"));
  EXPECT_TRUE(fs::exists(wd / "iter_8.safetensors"));
  EXPECT_FALSE(fs::exists(wd / "iter_6.safetensors"));
  EXPECT_FALSE(fs::exists(wd / "iter_6.state.safetensors"));
  EXPECT_EQ(read_file(wd / "last_checkpoint"), fs::absolute(wd / "iter_10.safetensors").string() + "\n");
}

TEST(WorkDir, WithoutConfigTheNameIsMnistAndWorkDirFlagMovesIt) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("config");
  const std::vector<std::string> args = {kTrainer,      "--data-dir", kDigits,     "--epochs", "1",
                                         "--limit",     "64",         "--test-limit", "64",      "--threads", "1"};
  ASSERT_EQ(run_in(tmp.path(), args, tmp / "a.log"), 0) << read_file(tmp / "a.log");
  EXPECT_TRUE(fs::exists(tmp / "work_dirs" / "mnist" / "config.json"));
  EXPECT_TRUE(fs::exists(tmp / "work_dirs" / "mnist" / "last_checkpoint"));
  auto moved = args;
  moved.insert(moved.end(), {"--work-dir", "elsewhere/run1"});
  ASSERT_EQ(run_in(tmp.path(), moved, tmp / "b.log"), 0) << read_file(tmp / "b.log");
  EXPECT_TRUE(fs::exists(tmp / "elsewhere" / "run1" / "config.json"));
  EXPECT_TRUE(fs::exists(tmp / "elsewhere" / "run1" / "iter_1.safetensors"));
}

TEST(WorkDir, UnusableWorkDirIsAClearError) {
  TempDir tmp("config");
  std::ofstream(tmp / "file") << "x";
  EXPECT_EQ(run_process({kTrainer, "--work-dir", tmp.file("file") + "/sub"}, tmp / "log"), 1);
  expect_one_line_error(read_file(tmp / "log"), "cannot create work dir");
}

// --cuda-graph refuses what it cannot capture correctly (the Runner decides, in setup), before touching the work dir:
// one line, exit 1. The device check comes last, so every other refusal is testable on a CPU machine.
TEST(CudaGraph, RefusesCpuFp16AdamCosineAndDdpInOneLine) {
  TempDir tmp("config");
  const std::string wd = tmp.file("wd");
  EXPECT_EQ(run_process({kTrainer, "--cuda-graph", "--device", "cpu", "--work-dir", wd}, tmp / "log"), 1);
  expect_one_line_error(read_file(tmp / "log"), "--cuda-graph (compile) needs a CUDA device, got --device cpu");
  EXPECT_EQ(run_process({kTrainer, "--cfg-options", "train.cuda_graph=true", "env.device=cpu", "--work-dir", wd},
                        tmp / "log"),
            1);
  expect_one_line_error(read_file(tmp / "log"), "--cuda-graph (compile) needs a CUDA device");
  EXPECT_EQ(run_process({kTrainer, "--cuda-graph", "--amp", "fp16", "--work-dir", wd}, tmp / "log"), 1);
  expect_one_line_error(read_file(tmp / "log"), "--cuda-graph (compile) cannot capture --amp fp16");
  EXPECT_NE(read_file(tmp / "log").find("use --amp bf16"), std::string::npos);
  EXPECT_EQ(run_process({kTrainer, "--cuda-graph", "--optimizer", "adam", "--work-dir", wd}, tmp / "log"), 1);
  expect_one_line_error(read_file(tmp / "log"), "--cuda-graph (compile) cannot capture the Adam optimizer");
  EXPECT_EQ(run_process({kTrainer, "--cuda-graph", "--lr-schedule", "cosine", "--work-dir", wd}, tmp / "log"), 1);
  expect_one_line_error(read_file(tmp / "log"), "use --lr-schedule step");
  // DDP: a torchrun-style environment for rank 0 of 2 (the refusal comes before any connection).
  const std::vector<std::pair<const char*, const char*>> env = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}};
  for (auto& [k, v] : env) ::setenv(k, v, 1);
  const int rc = run_process(
      {kTrainer, "--cuda-graph", "--launcher", "pytorch", "--backend", "gloo", "--work-dir", wd}, tmp / "log");
  EXPECT_EQ(rc, 1);
  expect_one_line_error(read_file(tmp / "log"), "--cuda-graph (compile) does not support DDP (2 ranks over gloo");
  // One launched rank is DDP too (a group and a reducer, as PyTorch's world size 1).
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "1", 1);
  const int rc1 = run_process(
      {kTrainer, "--cuda-graph", "--launcher", "pytorch", "--backend", "gloo", "--work-dir", wd}, tmp / "log");
  for (auto& [k, v] : env) ::unsetenv(k);
  EXPECT_EQ(rc1, 1);
  expect_one_line_error(read_file(tmp / "log"),
                        "--cuda-graph (compile) does not support DDP (1 rank over gloo, --launcher pytorch)");
  EXPECT_NE(read_file(tmp / "log").find("--launcher none"), std::string::npos);
  EXPECT_FALSE(fs::exists(wd)) << "a refused run leaves no work dir";
}

// The flags are one alias table onto config keys: it writes --help's key paths and docs/training.md's
// flags table, which must be the table as the trainer prints it.
TEST(Config, FlagsTableDrivesHelpAndTheDocs) {
  TempDir tmp("config");
  ASSERT_EQ(run_process({kTrainer, "--flags-markdown"}, tmp / "table"), 0);
  const std::string table = read_file(tmp / "table");
  EXPECT_NE(table.find("| `--lr V` | `optim_wrapper.optimizer.lr` |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `--no-shuffle` | `train_dataloader.sampler.shuffle` |"), std::string::npos) << table;
  EXPECT_NE(read_file(fs::path(TANDEM_SOURCE_DIR) / "docs/training.md").find(table), std::string::npos)
      << "docs/training.md's flags table differs from `tandem-mnist --flags-markdown`:\n" << table;
  ASSERT_EQ(run_process({kTrainer, "--help"}, tmp / "help"), 0);
  EXPECT_NE(read_file(tmp / "help").find("[model_wrapper_cfg.bucket_cap_mb]"), std::string::npos)
      << read_file(tmp / "help");
}
