// train/run_config: the registered types' keyword schemas (an unknown key with "did you mean", a
// wrong kind, a value out of range, defaults filled in), the sections' schemas, the load order
// (defaults <- file <- --cfg-options <- flags) with the flag named in errors, the one translation of
// the former own-shape keys, and the completed tree as a fixed point (config.json fed back gives
// the same config.json).
#include "train/run_config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/test_util.h"
#include "train/models/zoo.h"
#include "train/registries.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

using test::error_of;

const Schema& adadelta() { return *optimizers().schema("Adadelta"); }

TEST(RegistrySchema, UnknownKeyNamesTheClosestKnownOne) {
  const std::string e = error_of([] { apply_schema(args("optim_wrapper.optimizer", {{"lrr", "0.1"}}), adadelta()); });
  EXPECT_HAS(e, "optim_wrapper.optimizer: unknown argument 'lrr' (did you mean 'lr'?)");
}

// A factory reads its keys without a second default: the schema filled them in.
TEST(RegistrySchema, FactoriesReadTheKeysTheSchemaFilled) {
  const Kwargs filled = apply_schema(args("optim_wrapper.optimizer", {}), adadelta());
  EXPECT_EQ(filled.number("rho"), 0.9);
  EXPECT_EQ(filled.number("lr"), 1.0);
  EXPECT_HAS(error_of([] { args("optim_wrapper.optimizer", {}).number("rho"); }),
             "optim_wrapper.optimizer.rho is not set (a registered type's schema fills it in");
  EXPECT_HAS(error_of([] { args("m", {{"n", "1.5"}}).integer("n"); }), "m.n must be an integer, got 1.5");
}

TEST(RegistrySchema, WrongKindAndOutOfRangeNameTheKeyPath) {
  EXPECT_HAS(error_of([] { apply_schema(args("optim_wrapper.optimizer", {{"lr", "\"fast\""}}), adadelta()); }),
             "config key 'optim_wrapper.optimizer.lr' must be a number >= 0, got \"fast\"");
  EXPECT_HAS(error_of([] { apply_schema(args("optim_wrapper.optimizer", {{"rho", "1.5"}}), adadelta()); }),
             "config key 'optim_wrapper.optimizer.rho' must be between 0 and 1, got 1.5");
  Kwargs k = args("optim_wrapper.optimizer", {{"lr", "-1"}});
  k.set_origin("lr", "--lr");
  EXPECT_HAS(error_of([&] { apply_schema(k, adadelta()); }),
             "--lr (optim_wrapper.optimizer.lr): must be >= 0, got -1");
  EXPECT_HAS(error_of([] { apply_schema(args("model_wrapper_cfg", {{"powersgd_rank", "1.5"}}), ddp_schema()); }),
             "config key 'model_wrapper_cfg.powersgd_rank' must be an integer >= 1, got 1.5");
}

TEST(RegistrySchema, DefaultsAreFilledInFromTheOptionStructs) {
  const Kwargs filled = apply_schema(args("optim_wrapper.optimizer", {{"lr", "0.5"}}), adadelta());
  EXPECT_EQ(filled.number("lr", 0), 0.5);
  EXPECT_EQ(filled.number("rho", 0), optim::AdadeltaOptions{}.rho);
  EXPECT_EQ(filled.number("eps", 0), optim::AdadeltaOptions{}.eps);
  const Kwargs ddp = apply_schema(Kwargs("model_wrapper_cfg"), ddp_schema());
  EXPECT_EQ(ddp.number("bucket_cap_mb", -1), dist::DDPOptions{}.reducer.bucket_cap_mb);
  EXPECT_EQ(ddp.boolean("broadcast_buffers", false), dist::DDPOptions{}.broadcast_buffers);
}

TEST(RegistrySchema, ARegisteredFactoryGetsCheckedAndFilledKwargs) {
  Registry<std::function<double(int, const Kwargs&)>> reg("thing");
  reg.register_module("Scaled", [](int x, const Kwargs& k) { return x * k.number("factor", -1); },
                      {above(arg_number("factor", 2.0, "the factor"), 0)});
  EXPECT_EQ(reg.get("Scaled")(3, Kwargs("thing")), 6.0) << "the schema's default reaches the factory";
  EXPECT_EQ(reg.get("Scaled")(3, args("thing", {{"factor", "0.5"}})), 1.5);
  EXPECT_HAS(error_of([&] { reg.get("Scaled")(3, args("thing", {{"factor", "0"}})); }),
             "config key 'thing.factor' must be > 0, got 0");
  EXPECT_HAS(error_of([&] { reg.get("Scaled")(3, args("thing", {{"factr", "1"}})); }), "did you mean 'factor'?");
  ASSERT_NE(reg.schema("Scaled"), nullptr);
  EXPECT_HAS(describe_schema(*reg.schema("Scaled")), "factor (a number > 0, default 2.0): the factor");
}

TEST(RunConfig, SectionsCheckTheirKeysAndFillTheirDefaults) {
  Json c = complete_run_config(default_run_config());
  EXPECT_EQ(c["train_cfg"]["max_epochs"], 14);
  EXPECT_EQ(c["train_dataloader"]["sampler"]["shuffle"], true);
  EXPECT_EQ(c["env_cfg"]["dist_cfg"]["timeout"], 300.0);
  EXPECT_EQ(c["optim_wrapper"]["optimizer"]["rho"], 0.9) << "the registered type's schema default";
  EXPECT_EQ(c["val_dataloader"]["dataset"], c["train_dataloader"]["dataset"]) << "val follows train's dataset";
  Json typo = default_run_config();
  typo["train_cfg"]["max_epoch"] = 3;
  EXPECT_HAS(error_of([&] { complete_run_config(typo); }),
             "unknown key 'train_cfg.max_epoch' (did you mean 'train_cfg.max_epochs'?)");
  Json wrong = default_run_config();
  wrong["env_cfg"] = {{"dist_cfg", {{"backend", "mpi"}}}};
  EXPECT_HAS(error_of([&] { complete_run_config(wrong, {{"env_cfg.dist_cfg.backend", "config 'x.json'"}}); }),
             "config 'x.json': config key 'env_cfg.dist_cfg.backend' must be one of auto, gloo, nccl; got \"mpi\"");
  Json top = default_run_config();
  top["optim_wraper"] = Json::object();
  EXPECT_HAS(error_of([&] { complete_run_config(top); }), "did you mean 'optim_wrapper'?");
}

TEST(RunConfig, LoadOrderIsDefaultsFileCfgOptionsFlagsAndFlagsAreNamedInErrors) {
  test::TempDir tmp("run_config");
  std::ofstream(tmp / "c.json") << R"({"optim_wrapper": {"optimizer": {"lr": 0.5}}, "train_cfg": {"max_epochs": 3}})";
  LoadedConfig l = load_run_config(tmp.file("c.json"), {"train_cfg.max_epochs=4", "optim_wrapper.optimizer.lr=0.25"},
                                   {{"--lr", "optim_wrapper.optimizer.lr", Json(2.0)}});
  Json c = complete_run_config(l.tree, l.origins);
  EXPECT_EQ(c["optim_wrapper"]["optimizer"]["lr"], 2.0);
  EXPECT_EQ(c["train_cfg"]["max_epochs"], 4);
  EXPECT_EQ(c["train_dataloader"]["batch_size"], 64);
  l = load_run_config("", {}, {{"--epochs", "train_cfg.max_epochs", Json(0)}});
  EXPECT_HAS(error_of([&] { complete_run_config(l.tree, l.origins); }),
             "--epochs (train_cfg.max_epochs): must be >= 1, got 0");
}

TEST(RunConfig, FormerOwnShapeIsTranslatedOnceOrRefusedNamingTheNewKey) {
  const Json mm = translate_own_schema(
      Json::parse(R"({"optimizer": {"type": "sgd", "lr": 0.1}, "train": {"epochs": 2, "max_iters": 0},
                      "ddp": {"bucket_cap_mb": 5, "backend": "gloo"}, "schedule": {"type": "cosine", "gamma": 0.5},
                      "data": {"data_dir": "/d", "limit": 100}, "amp": "bf16"})"),
      "config 'old.json'");
  EXPECT_EQ(mm["optim_wrapper"]["optimizer"], Json::parse(R"({"type": "SGD", "lr": 0.1})"));
  EXPECT_EQ(mm["train_cfg"], Json::parse(R"({"max_epochs": 2})"));
  EXPECT_EQ(mm["model_wrapper_cfg"]["bucket_cap_mb"], 5);
  EXPECT_EQ(mm["env_cfg"]["dist_cfg"]["backend"], "gloo");
  EXPECT_EQ(mm["param_scheduler"], Json::parse(R"({"type": "CosineAnnealingLR", "by_epoch": false})"));
  EXPECT_EQ(mm["train_dataloader"]["dataset"], Json::parse(R"({"data_root": "/d", "indices": 100})"));
  EXPECT_EQ(mm["val_dataloader"]["dataset"]["data_root"], "/d");
  EXPECT_EQ(mm["optim_wrapper"]["dtype"], "bfloat16");
  EXPECT_HAS(error_of([] { translate_own_schema(Json::parse(R"({"train": {"epoch": 2}})"), "config 'old.json'"); }),
             "config 'old.json': unknown config key 'train.epoch' (did you mean 'train.epochs'?)");
  EXPECT_HAS(error_of([] { translate_own_schema(Json::parse(R"({"optimizer": {"zero_redundancy": true}})"), "x"); }),
             "is now optim_wrapper.optimizer.type 'ZeroRedundancyOptimizer' with optimizer_type");
}

// A former run's whole config.json (Tandem's former own shape, every key at its default) reads as
// the reference recipe.
TEST(RunConfig, FormerOwnShapeConfigJsonReadsAsTheReferenceRecipe) {
  const Json old = Json::parse(
      R"({"amp": "off", "custom_hooks": [], "data": {"batch_size": 64, "data_dir": "/usr/share/datasets/f)"
      R"(ashion-mnist", "limit": 0, "pad": true, "shuffle": true, "test_batch_size": 256, "test_limit": 0)"
      R"(}, "dataset": null, "ddp": {"backend": "auto", "broadcast_buffers": true, "bucket_cap_mb": 25.0,)"
      R"( "comm_hook": "allreduce", "find_unused_parameters": false, "first_bucket_cap_mb": 1.0, "gradien)"
      R"(t_as_bucket_view": false, "launcher": "none", "port": 0, "powersgd_rank": 1, "powersgd_start_ite)"
      R"(r": 1000, "static_graph": false, "sync_bn": false, "timeout_s": 300.0, "wrapper": "MMDistributed)"
      R"(DataParallel"}, "env": {"device": "auto", "threads": 0}, "load_from": "", "model": {"type": "Mni)"
      R"(stNet"}, "model_extra": null, "model_wrapper_extra": null, "optimizer": {"accumulative_counts": )"
      R"(1, "auto_scale_lr_base_batch": 0, "clip_grad_max_norm": 0.0, "clip_grad_norm_type": 2.0, "lr": 1)"
      R"(.0, "momentum": 0.0, "type": "adadelta", "weight_decay": 0.0, "zero_redundancy": false}, "optimi)"
      R"(zer_extra": null, "resume": false, "schedule": {"gamma": 0.7, "param_scheduler": [], "type": "st)"
      R"(ep"}, "test_evaluator": [], "train": {"checkpoint_interval_epochs": 1, "checkpoint_interval_iter)"
      R"(s": 0, "cuda_graph": false, "epochs": 14, "eval_interval": 1, "log_interval": 100, "max_iters": )"
      R"(0, "max_keep_ckpts": 3, "save_best": "", "seed": 1, "vis_backends": ["LocalVisBackend"]}, "val_e)"
      R"(valuator": [], "work_dir": ""})");
  Json from_old = complete_run_config(merge_onto_defaults(default_run_config(), translate_own_schema(old, "old")));
  Json recipe = complete_run_config(default_run_config());
  from_old.erase("work_dir");
  recipe.erase("work_dir");
  EXPECT_EQ(from_old, recipe);
}

// A run's config.json (the completed tree), fed back as the config, completes to itself.
TEST(RunConfig, CompletedTreeIsAFixedPoint) {
  test::TempDir tmp("run_config");
  std::ofstream(tmp / "c.json") << R"({"optim_wrapper": {"type": "AmpOptimWrapper",
      "optimizer": {"type": "AdamW", "lr": 0.001}, "clip_grad": {"max_norm": 1}},
      "param_scheduler": [{"type": "LinearLR", "by_epoch": false, "end": 10}, {"type": "StepLR", "gamma": 0.5},
                          {"type": "CosineAnnealingLR", "eta_min_ratio": 0.1}],
      "model_wrapper_cfg": {"type": "MMFullyShardedDataParallel", "sharding_strategy": "SHARD_GRAD_OP"},
      "default_hooks": {"checkpoint": {"save_best": "auto"}},
      "train_cfg": {"by_epoch": false, "max_iters": 20},
      "custom_hooks": [{"type": "EMAHook"}, {"type": "EarlyStoppingHook", "monitor": "loss"}]})";
  const LoadedConfig l = load_run_config(tmp.file("c.json"), {}, {});
  const Json once = complete_run_config(l.tree, l.origins);
  std::ofstream(tmp / "config.json") << once.dump(2);
  const LoadedConfig again = load_run_config(tmp.file("config.json"), {}, {});
  EXPECT_EQ(complete_run_config(again.tree, again.origins), once);
  EXPECT_EQ(once["train_cfg"]["type"], "IterBasedTrainLoop");
  EXPECT_FALSE(once["train_cfg"].contains("max_epochs"));
  EXPECT_EQ(once["optim_wrapper"]["clip_grad"]["norm_type"], 2.0);
  EXPECT_EQ(once["optim_wrapper"]["optimizer"]["weight_decay"], 0.01) << "AdamW's own default";
  // Every registered type's schema filled its defaults in, and they read back unchanged.
  EXPECT_EQ(once["param_scheduler"][2]["by_epoch"], true);
  EXPECT_FALSE(once["param_scheduler"][2].contains("eta_min")) << "no default: absent means 0 unless a ratio is given";
  EXPECT_EQ(once["model_wrapper_cfg"]["forward_prefetch"], true);
  EXPECT_FALSE(once["model_wrapper_cfg"].contains("bucket_cap_mb")) << "DDP's keys are not filled in for FSDP";
  EXPECT_EQ(once["custom_hooks"][0]["momentum"], 0.0002);
  EXPECT_EQ(once["custom_hooks"][1]["patience"], 5);
  EXPECT_TRUE(once["custom_hooks"][1]["rule"].is_null());
  EXPECT_EQ(once["default_hooks"]["checkpoint"]["max_keep_ckpts"], 3) << "the Runner's default over the hook's";
  Json no_norm = l.tree;
  no_norm["optim_wrapper"]["clip_grad"] = {{"norm_type", 2}};
  EXPECT_HAS(error_of([&] { complete_run_config(no_norm); }), "config key 'optim_wrapper.clip_grad.max_norm' is required");
}


// Runner::from_config builds and trains the job of a tree; the config.json it writes, fed back as
// the config, gives the identical config.json.
TEST(RunConfig, RunnerFromConfigWritesAConfigJsonThatReproducesItself) {
  register_tiny();
  register_tiny_set();
  test::TempDir tmp("run_config");
  Json tree = Json::parse(R"({"model": {"type": "TinyNet"},
      "optim_wrapper": {"optimizer": {"type": "SGD", "lr": 0.5}}, "param_scheduler": [],
      "train_cfg": {"max_epochs": 1}, "train_dataloader": {"batch_size": 8, "dataset": {"type": "TinySet"}},
      "env_cfg": {"device": "cpu"}, "default_hooks": {"checkpoint": {"interval": 0}}})");
  tree["work_dir"] = tmp.file("a");
  ASSERT_EQ(Runner::from_config(tree.dump())->train(), 0);
  const Json first = Json::parse(test::read_file(tmp / "a" / "config.json"));
  EXPECT_EQ(first["train_dataloader"]["dataset"]["n"], 40) << "the dataset's schema default";
  EXPECT_EQ(first["optim_wrapper"]["optimizer"]["momentum"], 0.0) << "SGD's schema default";
  const LoadedConfig again = load_run_config((tmp / "a" / "config.json").string(), {}, {});
  EXPECT_EQ(complete_run_config(again.tree, again.origins), first);
}


// RunnerOptions{} and the default config tree agree: the sections' schemas read their defaults from
// RunnerOptions, so a key left out of a config and a field left alone mean the same.
TEST(RunConfig, RunnerOptionsDefaultsAreTheDefaultConfigTrees) {
  register_tiny_set();
  Json tree = default_run_config();
  tree["train_dataloader"]["dataset"] = {{"type", "TinySet"}};  // the recipe's data set needs no files here
  const RunnerOptions c = runner_options_from_config(tree), d;
  EXPECT_EQ(c.model, d.model);
  EXPECT_EQ(c.model_wrapper, d.model_wrapper);
  EXPECT_EQ(c.optimizer, d.optimizer);
  EXPECT_EQ(c.optimizer_args.number("lr", -1), apply_schema(d.optimizer_args, adadelta()).number("lr", -2));
  ASSERT_EQ(c.param_schedulers.size(), 1u);
  EXPECT_EQ(c.param_schedulers[0].type, d.param_scheduler);
  EXPECT_EQ(c.max_epochs, d.max_epochs);
  EXPECT_EQ(c.max_iters, d.max_iters);
  EXPECT_EQ(c.val_interval, d.val_interval);
  EXPECT_EQ(c.batch_size, d.batch_size);
  EXPECT_EQ(c.val_batch_size, d.val_batch_size);
  EXPECT_EQ(c.shuffle, d.shuffle);
  EXPECT_EQ(c.pad, d.pad);
  EXPECT_EQ(c.seed, d.seed);
  EXPECT_EQ(c.amp, d.amp);
  EXPECT_EQ(c.optim_wrapper, d.optim_wrapper);
  EXPECT_EQ(c.accumulative_counts, d.accumulative_counts);
  EXPECT_EQ(c.clip_max_norm, d.clip_max_norm);
  EXPECT_EQ(c.clip_norm_type, d.clip_norm_type);
  EXPECT_EQ(c.auto_scale_lr_base_batch, d.auto_scale_lr_base_batch);
  EXPECT_EQ(c.device, d.device);
  EXPECT_EQ(c.threads, d.threads);
  EXPECT_EQ(c.launcher, d.launcher);
  EXPECT_EQ(c.backend, d.backend);
  EXPECT_EQ(c.dist_timeout_s, d.dist_timeout_s);
  EXPECT_EQ(c.port, d.port);
  EXPECT_EQ(c.sync_bn, d.sync_bn);
  EXPECT_EQ(c.cuda_graph, d.cuda_graph);
  EXPECT_EQ(c.log_interval, d.log_interval);
  EXPECT_EQ(c.checkpoint_interval_epochs, d.checkpoint_interval_epochs);
  EXPECT_EQ(c.checkpoint_interval_iters, d.checkpoint_interval_iters);
  EXPECT_EQ(c.max_keep_ckpts, d.max_keep_ckpts);
  EXPECT_EQ(c.save_best, d.save_best);
  EXPECT_EQ(c.vis_backends, d.vis_backends);
  EXPECT_EQ(c.resume, d.resume);
  EXPECT_EQ(c.load_from, d.load_from);
  EXPECT_TRUE(c.custom_hooks.empty() && d.custom_hooks.empty());
}

}  // namespace
}  // namespace tandem::train
