// tandem-mnist as MMEngine's tools/train.py: `tandem-mnist CONFIG [--work-dir|--work_dir DIR]
// [--resume] [--amp] [--launcher ...] [--cfg-options k=v ...] [--local_rank=N]`, MMEngine-shaped
// configs with _base_ inheritance kept in MMEngine's shape (the bundled configs equal the former
// Tandem-shaped ones they replace, which are translated as they are read), MMEngine keys in
// --cfg-options, errors as one line with exit code 2 (config) or 1 (run), and a wrapper type nobody
// registered named with the registered ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace tandem::test;

namespace {

const std::string kConfigs = TANDEM_SOURCE_DIR "/configs";

json print_config(const TempDir& tmp, std::vector<std::string> args) {
  args.insert(args.begin(), kTrainer);
  args.push_back("--print-config");
  const int rc = run_process(args, tmp / "print.log");
  EXPECT_EQ(rc, 0) << read_file(tmp / "print.log");
  return json::parse(read_file(tmp / "print.log"), nullptr, false);
}

}  // namespace

// `c` without its work dir (named after each config file).
static json without_work_dir(json c) {
  c.erase("work_dir");
  return c;
}

TEST(MMEngineConfig, BundledConfigsEqualTheTandemShapedOnesTheyReplace) {
  TempDir tmp("mmcli");
  // configs/mnist_sgd.json before it was converted (Tandem's former own shape, still read).
  std::ofstream(tmp / "old_sgd.json") << R"({"optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9,
      "weight_decay": 0.0001}, "schedule": {"type": "cosine"}, "train": {"epochs": 3}})";
  std::ofstream(tmp / "old_ddp.json") << R"({"ddp": {"launcher": "pytorch", "gradient_as_bucket_view": true},
      "optimizer": {"auto_scale_lr_base_batch": 64}, "train": {"checkpoint_interval_iters": 500}})";
  EXPECT_EQ(without_work_dir(print_config(tmp, {kConfigs + "/mnist_sgd.json"})),
            without_work_dir(print_config(tmp, {"--config", tmp.file("old_sgd.json")})));
  const json ddp = print_config(tmp, {"--config", tmp.file("old_ddp.json")});
  EXPECT_EQ(ddp["launcher"], "pytorch");
  EXPECT_EQ(ddp["model_wrapper_cfg"]["gradient_as_bucket_view"], true);
  EXPECT_EQ(ddp["auto_scale_lr"], json::parse(R"({"enable": true, "base_batch_size": 64})"));
  EXPECT_EQ(ddp["default_hooks"]["checkpoint"]["interval_iters"], 500);
  const json bf16 = print_config(tmp, {kConfigs + "/mnist_bf16.json"});  // two levels of _base_
  EXPECT_EQ(bf16["optim_wrapper"]["type"], "AmpOptimWrapper");
  EXPECT_EQ(bf16["param_scheduler"][0]["type"], "CosineAnnealingLR");
  EXPECT_EQ(bf16["train_cfg"]["max_epochs"], 1);
}

TEST(MMEngineConfig, KeysAndCfgOptionsKeepMMEngineShape) {
  TempDir tmp("mmcli");
  std::ofstream(tmp / "base.json") << R"({"optim_wrapper": {"type": "OptimWrapper",
      "optimizer": {"type": "SGD", "lr": 0.1, "momentum": 0.9}},
      "train_cfg": {"by_epoch": true, "max_epochs": 5, "val_interval": 2},
      "randomness": {"seed": 7}})";
  std::ofstream(tmp / "child.json") << R"({"_base_": ["base.json"],
      "optim_wrapper": {"type": "AmpOptimWrapper", "dtype": "bfloat16", "accumulative_counts": 2,
                        "clip_grad": {"max_norm": 3.5, "norm_type": 2}},
      "model_wrapper_cfg": {"type": "MMDistributedDataParallel", "find_unused_parameters": true,
                            "static_graph": true, "broadcast_buffers": false},
      "env_cfg": {"dist_cfg": {"backend": "gloo", "timeout": 60}},
      "default_hooks": {"logger": {"type": "LoggerHook", "interval": 7},
                        "checkpoint": {"type": "CheckpointHook", "interval": 2, "max_keep_ckpts": -1,
                                       "save_best": "auto"}},
      "train_dataloader": {"batch_size": 32, "sampler": {"type": "DefaultSampler", "shuffle": false}},
      "auto_scale_lr": {"enable": true, "base_batch_size": 128}})";
  json c = print_config(tmp, {tmp.file("child.json"), "--work_dir", tmp.file("wd"), "--cfg-options",
                              "dist_params.port=29601", "optim_wrapper.optimizer.lr=0.25", "train.log_interval=9"});
  const json& opt = c["optim_wrapper"]["optimizer"];
  EXPECT_EQ(opt["type"], "SGD");
  EXPECT_EQ(opt["lr"], 0.25) << "MMEngine keys in --cfg-options override the file";
  EXPECT_EQ(opt["momentum"], 0.9) << "inherited from _base_";
  EXPECT_EQ(opt["nesterov"], false) << "SGD's schema default filled in";
  EXPECT_EQ(c["optim_wrapper"]["accumulative_counts"], 2);
  EXPECT_EQ(c["optim_wrapper"]["clip_grad"]["max_norm"], 3.5);
  EXPECT_EQ(c["optim_wrapper"]["type"], "AmpOptimWrapper");
  EXPECT_EQ(c["optim_wrapper"]["dtype"], "bfloat16");
  EXPECT_EQ(c["auto_scale_lr"]["base_batch_size"], 128);
  EXPECT_EQ(c["train_cfg"]["max_epochs"], 5);
  EXPECT_EQ(c["train_cfg"]["val_interval"], 2);
  EXPECT_EQ(c["randomness"]["seed"], 7);
  EXPECT_EQ(c["default_hooks"]["logger"]["interval"], 9) << "a former own-shape key in --cfg-options, translated";
  EXPECT_EQ(c["default_hooks"]["checkpoint"]["interval"], 2);
  EXPECT_EQ(c["default_hooks"]["checkpoint"]["max_keep_ckpts"], -1);
  EXPECT_EQ(c["default_hooks"]["checkpoint"]["save_best"], "auto");
  EXPECT_EQ(c["model_wrapper_cfg"]["find_unused_parameters"], true);
  EXPECT_EQ(c["model_wrapper_cfg"]["static_graph"], true);
  EXPECT_EQ(c["model_wrapper_cfg"]["broadcast_buffers"], false);
  EXPECT_EQ(c["env_cfg"]["dist_cfg"]["backend"], "gloo");
  EXPECT_EQ(c["env_cfg"]["dist_cfg"]["timeout"], 60.0);
  EXPECT_EQ(c["dist_params"]["port"], 29601);
  EXPECT_EQ(c["train_dataloader"]["batch_size"], 32);
  EXPECT_EQ(c["train_dataloader"]["sampler"]["shuffle"], false);
  EXPECT_EQ(c["work_dir"], tmp.file("wd"));
  EXPECT_EQ(print_config(tmp, {tmp.file("child.json"), "--work-dir", "x"})["work_dir"], "x");
  const json amp = print_config(tmp, {tmp.file("child.json"), "--amp"})["optim_wrapper"];
  EXPECT_EQ(amp["type"], "AmpOptimWrapper");
  EXPECT_TRUE(amp["dtype"].is_null()) << "--amp alone, as MMEngine's: the dtype follows the device";
}

TEST(MMEngineConfig, UnsupportedKeysAndCyclesAreOneLineErrors) {
  TempDir tmp("mmcli");
  EXPECT_EQ(run_process({kTrainer, "--cfg-options", "param_scheduler.type=OneCycleLR", "--print-config"},
                        tmp / "log"),
            2);
  expect_one_line_error(read_file(tmp / "log"), "--cfg-options: config key 'param_scheduler[0].type' 'OneCycleLR' is "
                                                "not a registered param scheduler");
  EXPECT_NE(read_file(tmp / "log").find("registered: ConstantLR, CosineAnnealingLR"), std::string::npos);
  // An optimizer's own keywords are checked by its schema: AdamW takes betas.
  EXPECT_EQ(run_process({kTrainer, "--cfg-options", "optim_wrapper.optimizer.type=AdamW",
                         "optim_wrapper.optimizer.betas=(0.9,0.99)", "--print-config"},
                        tmp / "log"),
            0);
  EXPECT_EQ(json::parse(read_file(tmp / "log"))["optim_wrapper"]["optimizer"]["betas"], json::parse("[0.9, 0.99]"));
  std::ofstream(tmp / "a.json") << R"({"_base_": "b.json"})";
  std::ofstream(tmp / "b.json") << R"({"_base_": "a.json"})";
  EXPECT_EQ(run_process({kTrainer, tmp.file("a.json"), "--print-config"}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "_base_ inherits from itself");
  EXPECT_EQ(run_process({kTrainer, tmp.file("a.json"), "--config", tmp.file("b.json")}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "two configs given");
}

// MMEngine's visualizer: its vis_backends reach the Runner (train.vis_backends), from a .py config
// that names them in a variable first as MMDetection's do; a run writes scalars.json and a TensorBoard
// event file; any other vis backend, from --cfg-options or a JSON config, is a one-line error naming
// it and the supported ones.
TEST(MMEngineConfig, VisualizerVisBackendsReachTheRunnerAndOthersAreRefused) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("mmcli");
  std::ofstream(tmp / "tb.py") << R"(_base_ = [')" << kConfigs << R"(/mnist_adadelta.json']
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends, name='visualizer')
train_cfg = dict(max_epochs=1)
)";
  EXPECT_EQ(print_config(tmp, {tmp.file("tb.py")})["visualizer"]["vis_backends"],
            json::parse(R"([{"type": "LocalVisBackend"}, {"type": "TensorboardVisBackend"}])"));
  EXPECT_EQ(print_config(tmp, {})["visualizer"]["vis_backends"], json::parse(R"([{"type": "LocalVisBackend"}])"));
  EXPECT_EQ(run_process({kTrainer, tmp.file("tb.py"), "--data-dir", kDigits, "--limit", "128", "--test-limit", "64",
                         "--work-dir", tmp.file("w")},
                        tmp / "log"),
            0)
      << read_file(tmp / "log");
  int events = 0;
  for (const auto& f : fs::directory_iterator(tmp / "w" / "vis_data"))
    events += f.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(events, 1);
  EXPECT_TRUE(fs::exists(tmp / "w" / "vis_data" / "scalars.json"));

  EXPECT_EQ(run_process({kTrainer, "--cfg-options",
                         R"(visualizer.vis_backends=[{"type":"TensorboardVisBackend"},{"type":"WandbVisBackend"}])",
                         "--print-config"},
                        tmp / "log"),
            2);
  expect_one_line_error(read_file(tmp / "log"),
                        "--cfg-options: visualizer.vis_backends[1]: vis backend 'WandbVisBackend' is not supported by "
                        "Tandem (supported: LocalVisBackend, TensorboardVisBackend); remove it or use one of those");
  std::ofstream(tmp / "ml.json") << R"({"visualizer": {"type": "Visualizer",
      "vis_backends": [{"type": "MLflowVisBackend"}]}})";
  EXPECT_EQ(run_process({kTrainer, tmp.file("ml.json"), "--print-config"}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "visualizer.vis_backends[0]: vis backend 'MLflowVisBackend' is not "
                                                "supported by Tandem (supported: LocalVisBackend, TensorboardVisBackend)");
  EXPECT_EQ(run_process({kTrainer, "--cfg-options", R"(train.vis_backends=["ClearMLVisBackend"])", "--print-config"},
                        tmp / "log"),
            2);
  expect_one_line_error(read_file(tmp / "log"), "--cfg-options: visualizer.vis_backends[0]: vis backend "
                                                "'ClearMLVisBackend'");
}

TEST(MMEngineConfig, UnknownWrapperTypeNamesTheRegisteredOnes) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("mmcli");
  EXPECT_EQ(run_process({kTrainer, "--data-dir", kDigits, "--limit", "64", "--epochs", "1", "--work-dir",
                         tmp.file("w"), "--cfg-options", "model_wrapper_cfg.type=NoSuchDDP"},
                        tmp / "log"),
            2);
  expect_one_line_error(read_file(tmp / "log"),
                        "config key 'model_wrapper_cfg.type' 'NoSuchDDP' is not a registered model wrapper "
                        "(registered: DistributedDataParallel, FullyShardedDataParallel, MMDistributedDataParallel, "
                        "MMFullyShardedDataParallel)");
}

// MMEngine's param_scheduler as a list (warm-up by iteration, then MultiStepLR by epoch) and
// custom_hooks (EMAHook, EarlyStoppingHook) carried from a .py config, and the same list as JSON, to
// the Runner: the lrs the log shows are the list's; a single scheduler is a list of one.
TEST(MMEngineConfig, SchedulerListsAndCustomHooksTrain) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("mmcli");
  std::ofstream(tmp / "warm.py") << R"(_base_ = [')" << kConfigs << R"(/mnist_adadelta.json']
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=3),
    dict(type='MultiStepLR', by_epoch=True, milestones=[1], gamma=0.1),
]
custom_hooks = [dict(type='EMAHook', momentum=0.0002),
                dict(type='EarlyStoppingHook', monitor='accuracy', patience=5)]
train_cfg = dict(max_epochs=2)
default_hooks = dict(logger=dict(type='LoggerHook', interval=1))
)";
  const json c = print_config(tmp, {tmp.file("warm.py")});
  ASSERT_EQ(c["param_scheduler"].size(), 2u);
  EXPECT_EQ(c["param_scheduler"][1]["milestones"], json::array({1}));
  EXPECT_EQ(c["custom_hooks"][0]["type"], "EMAHook");
  EXPECT_EQ(run_process({kTrainer, tmp.file("warm.py"), "--data-dir", kDigits, "--limit", "256", "--test-limit", "64",
                         "--work-dir", tmp.file("w")},
                        tmp / "log"),
            0)
      << read_file(tmp / "log");
  const std::string log = read_file(tmp / "log");
  // 4 iterations per epoch: 0.1 x 0.001, the warm-up's linear steps to 0.1 at iteration 3, then 0.01.
  EXPECT_NE(log.find("Epoch(train) [1][1/4] base_lr: 1.0000e-01 lr: 1.0000e-04"), std::string::npos) << log;
  EXPECT_NE(log.find("Epoch(train) [1][3/4] base_lr: 1.0000e-01 lr: 1.0000e-01"), std::string::npos) << log;
  EXPECT_NE(log.find("Epoch(train) [2][1/4] base_lr: 1.0000e-01 lr: 1.0000e-02"), std::string::npos) << log;
  // A keyword argument the scheduler does not know is a config error (exit 2), found by its schema as
  // the config is completed, before anything is built.
  EXPECT_EQ(run_process({kTrainer, "--cfg-options", "param_scheduler=[{\"type\":\"MultiStepLR\",\"milestone\":[2]}]",
                         "--data-dir", kDigits, "--limit", "64", "--epochs", "1", "--work-dir", tmp.file("bad")},
                        tmp / "bad.log"),
            2);
  EXPECT_NE(read_file(tmp / "bad.log").find("error: param_scheduler[0]: unknown argument 'milestone' "
                                            "(did you mean 'milestones'?); expected one of: by_epoch, begin, end, "
                                            "convert_to_iter_based, milestones, gamma"),
            std::string::npos)
      << read_file(tmp / "bad.log");
  std::ofstream(tmp / "warm.json") << R"({"_base_": ")" << kConfigs << R"(/mnist_adadelta.json",
      "param_scheduler": [{"type": "LinearLR", "start_factor": 0.001, "by_epoch": false, "begin": 0, "end": 500},
                          {"type": "MultiStepLR", "by_epoch": true, "milestones": [8, 11], "gamma": 0.1}]})";
  EXPECT_EQ(print_config(tmp, {tmp.file("warm.json")})["param_scheduler"][0]["end"], 500);
  std::ofstream(tmp / "one.json") << R"({"param_scheduler": [{"type": "StepLR", "by_epoch": true, "gamma": 0.5}]})";
  const json one = print_config(tmp, {tmp.file("one.json")});
  ASSERT_EQ(one["param_scheduler"].size(), 1u);
  EXPECT_EQ(one["param_scheduler"][0]["gamma"], 0.5);
  EXPECT_EQ(one["param_scheduler"][0]["step_size"], 1) << "StepLR's schema default filled in";
}

// --local_rank=N / --local-rank=N set LOCAL_RANK for the launcher's checks; LOCAL_RANK wins when set.
TEST(MMEngineConfig, LocalRankFlagFeedsTheLauncherUnlessTheEnvironmentSetsIt) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("mmcli");
  const std::vector<std::string> env = {"RANK=0", "WORLD_SIZE=1", "LOCAL_WORLD_SIZE=1", "LOCAL_RANK", "GROUP_RANK=0",
                                        "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(free_port())};
  for (const char* flag : {"--local_rank=3", "--local-rank=3"}) {
    Process p({kTrainer, flag, "--launcher", "pytorch", "--data-dir", kDigits, "--limit", "64", "--test-limit", "64",
               "--epochs", "1", "--work-dir", tmp.file("w")},
              tmp / "log", env);
    EXPECT_EQ(p.wait_for(seconds(120)), 1) << p.output();
    expect_one_line_error(p.output(), "LOCAL_RANK=3 must be smaller than LOCAL_WORLD_SIZE=1");
  }
  std::vector<std::string> env0 = env;
  env0[3] = "LOCAL_RANK=0";
  Process p({kTrainer, "--local_rank=3", "--launcher", "pytorch", "--data-dir", kDigits, "--limit", "64",
             "--test-limit", "64", "--epochs", "1", "--work-dir", tmp.file("w")},
            tmp / "log", env0);
  EXPECT_EQ(p.wait_for(seconds(120)), 0) << p.output();
}
