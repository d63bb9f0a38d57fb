// Every registered type owns its keyword schema (models, wrappers, optimizers, schedulers, hooks,
// metrics, datasets), and a scheduler's, a hook's and FSDP's keywords are checked by it once: an
// unknown key with the closest known one, a wrong kind, a value out of range, a missing required key,
// each a one-line error naming the key; the defaults reach the factory.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "dist/parallel/fsdp.h"
#include "optim/optimizer.h"
#include "train/evaluator.h"
#include "train/models/zoo.h"
#include "train/registries.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

using test::error_of;

template <typename Factory>
std::vector<std::string> without_schema(const Registry<Factory>& reg) {
  std::vector<std::string> out;
  for (const std::string& name : reg.names())
    if (reg.schema(name) == nullptr) out.push_back(reg.kind() + " " + name);
  return out;
}

TEST(RegistrySchemas, EveryRegisteredTypeOwnsASchema) {
  std::vector<std::string> missing;
  for (const auto& names : {without_schema(models()), without_schema(model_wrappers()), without_schema(optimizers()),
                            without_schema(param_schedulers()), without_schema(hooks()),
                            without_schema(metric_types()), without_schema(datasets())})
    missing.insert(missing.end(), names.begin(), names.end());
  EXPECT_TRUE(missing.empty()) << "registered without a schema: " << ::testing::PrintToString(missing);
  // The registries hold what the docs list (a registry that silently lost its entries passes the above).
  EXPECT_GE(param_schedulers().names().size(), 6u);
  EXPECT_GE(hooks().names().size(), 9u);
  EXPECT_TRUE(model_wrappers().contains("MMFullyShardedDataParallel"));
  EXPECT_TRUE(datasets().contains("CharCorpus"));
}

std::string scheduler_error(const Kwargs& k, const char* type = "CosineAnnealingLR") {
  return error_of([&] { param_schedulers().get(type)(ScheduleContext{}, k); });
}

TEST(RegistrySchemas, SchedulerKeywordsAreCheckedOnce) {
  const char* owner = "param_scheduler[0]";
  EXPECT_HAS(scheduler_error(args(owner, {{"eta_mn", "0.1"}})),
             "param_scheduler[0]: unknown argument 'eta_mn' (did you mean 'eta_min'?); expected one of: by_epoch, "
             "begin, end, convert_to_iter_based, T_max, eta_min, eta_min_ratio");
  EXPECT_HAS(scheduler_error(args(owner, {{"T_max", "2.5"}})),
             "config key 'param_scheduler[0].T_max' must be an integer >= 1 (or null), got 2.5");
  EXPECT_HAS(scheduler_error(args(owner, {{"eta_min_ratio", "-0.5"}})),
             "config key 'param_scheduler[0].eta_min_ratio' must be >= 0, got -0.5");
  EXPECT_HAS(scheduler_error(args(owner, {{"begin", "-1"}})), "config key 'param_scheduler[0].begin' must be >= 0, got -1");
  EXPECT_HAS(scheduler_error(args(owner, {{"by_epoch", "\"yes\""}})),
             "config key 'param_scheduler[0].by_epoch' must be true or false, got \"yes\"");
  EXPECT_HAS(scheduler_error(args(owner, {{"factor", "1.5"}}), "ConstantLR"),
             "config key 'param_scheduler[0].factor' must be in (0, 1], got 1.5");
  EXPECT_HAS(scheduler_error(args(owner, {}), "ExponentialLR"),
             "config key 'param_scheduler[0].gamma' is required (the lr's factor per step)");
  const std::string e = scheduler_error(args(owner, {{"step_sise", "2"}}), "StepLR");
  EXPECT_HAS(e, "did you mean 'step_size'?");
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(RegistrySchemas, SchedulerDefaultsReachTheFactory) {
  Tensor w = Tensor::ones({1});
  w.set_requires_grad(true);
  optim::SGD sgd(std::vector<Tensor>{w}, optim::SGDOptions{0.3});
  ScheduleContext c{&sgd, 4, 2, {}};
  // LinearLR's start_factor default (1/3) applied by the constructor step; end the run's (2 epochs).
  auto s = param_schedulers().get("LinearLR")(c, Kwargs("param_scheduler[0]"));
  EXPECT_NEAR(sgd.param_groups()[0].lr, 0.1, 1e-12);
  EXPECT_EQ(s->state_dict().at("end"), 2.0);
  EXPECT_NEAR(s->state_dict().at("start_factor"), 1.0 / 3, 1e-15);
  const Kwargs filled = apply_schema(Kwargs("p"), *param_schedulers().schema("StepLR"));
  EXPECT_EQ(filled.integer("step_size", 0), 1);
  EXPECT_EQ(filled.number("gamma", 0), 0.1);
  EXPECT_FALSE(filled.has("end")) << "end has no default: absent is the end of the run";
}

TEST(RegistrySchemas, HookKeywordsAreCheckedOnce) {
  const HookFactory checkpoint = hooks().get("CheckpointHook");
  const char* owner = "default_hooks.checkpoint";
  EXPECT_HAS(error_of([&] { checkpoint(args(owner, {{"max_keep_ckpt", "2"}})); }),
             "default_hooks.checkpoint: unknown argument 'max_keep_ckpt' (did you mean 'max_keep_ckpts'?)");
  EXPECT_HAS(error_of([&] { checkpoint(args(owner, {{"interval", "\"2\""}})); }),
             "config key 'default_hooks.checkpoint.interval' must be an integer >= 0, got \"2\"");
  EXPECT_HAS(error_of([&] { checkpoint(args(owner, {{"interval_iters", "-5"}})); }),
             "config key 'default_hooks.checkpoint.interval_iters' must be >= 0, got -5");
  EXPECT_HAS(error_of([&] { checkpoint(args(owner, {{"rule", "\"bigger\""}})); }),
             "config key 'default_hooks.checkpoint.rule' must be one of greater, less; got \"bigger\"");
  EXPECT_NE(checkpoint(args(owner, {{"save_best", "null"}, {"rule", "null"}})), nullptr) << "null is MMEngine's None";
  EXPECT_HAS(error_of([&] { hooks().get("LoggerHook")(args("default_hooks.logger", {{"interval", "0"}})); }),
             "config key 'default_hooks.logger.interval' must be >= 1, got 0");
  EXPECT_HAS(error_of([&] { hooks().get("EarlyStoppingHook")(args("custom_hooks[0]", {{"patience", "3"}})); }),
             "config key 'custom_hooks[0].monitor' is required");
  EXPECT_HAS(error_of([&] { hooks().get("IterTimerHook")(args("default_hooks.timer", {{"interval", "1"}})); }),
             "default_hooks.timer: unknown argument 'interval'; expected one of: (none)");
}

WrapContext no_context() { return WrapContext{}; }

TEST(RegistrySchemas, FsdpKeywordsAreCheckedOnce) {
  for (const char* type : {"MMFullyShardedDataParallel", "FullyShardedDataParallel"}) {
    const WrapperFactory wrap = model_wrappers().get(type);
    const char* owner = "model_wrapper_cfg";
    EXPECT_HAS(error_of([&] { wrap(no_context(), args(owner, {{"sharding_stratgy", "\"NO_SHARD\""}})); }),
               "model_wrapper_cfg: unknown argument 'sharding_stratgy' (did you mean 'sharding_strategy'?)");
    EXPECT_HAS(error_of([&] { wrap(no_context(), args(owner, {{"sharding_strategy", "\"FULL\""}})); }),
               "config key 'model_wrapper_cfg.sharding_strategy' must be one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
               "HYBRID_SHARD; got \"FULL\"");
    EXPECT_HAS(error_of([&] { wrap(no_context(), args(owner, {{"forward_prefetch", "1"}})); }),
               "config key 'model_wrapper_cfg.forward_prefetch' must be true or false, got 1");
    EXPECT_HAS(error_of([&] { wrap(no_context(), args(owner, {{"backward_prefetch", "\"BACKWARD\""}})); }),
               "config key 'model_wrapper_cfg.backward_prefetch' must be one of BACKWARD_PRE, BACKWARD_POST; got");
    EXPECT_HAS(error_of([&] { wrap(no_context(), args(owner, {{"bucket_cap_mb", "-1"}})); }),
               "config key 'model_wrapper_cfg.bucket_cap_mb' must be >= 0, got -1");
  }
  const Kwargs filled = apply_schema(Kwargs("model_wrapper_cfg"), fsdp_schema());
  EXPECT_EQ(filled.string("sharding_strategy", ""), "FULL_SHARD");
  EXPECT_EQ(filled.boolean("forward_prefetch", false), dist::FSDPOptions{}.forward_prefetch);
  EXPECT_FALSE(filled.has("bucket_cap_mb")) << "DDP's keys are accepted, not filled in";
}

TEST(RegistrySchemas, ZeroRedundancyOptimizerHandsItsOtherKeysToTheWrappedSchema) {
  const OptimizerFactory zero = optimizers().get("ZeroRedundancyOptimizer");
  Tensor w = Tensor::ones({2});
  w.set_requires_grad(true);
  EXPECT_HAS(error_of([&] { zero({w}, args("optim_wrapper.optimizer", {{"lr", "0.1"}})); }),
             "config key 'optim_wrapper.optimizer.optimizer_type' is required");
  EXPECT_HAS(error_of([&] { zero({w}, args("optim_wrapper.optimizer", {{"optimizer_type", "\"SGD\""}, {"moment", "0.9"}})); }),
             "unknown argument 'moment' (did you mean 'momentum'?)");
  auto opt = zero({w}, args("optim_wrapper.optimizer", {{"optimizer_type", "\"SGD\""}, {"lr", "0.25"}}));
  EXPECT_EQ(opt->param_groups()[0].lr, 0.25);
}

TEST(RegistrySchemas, ModelAndDatasetKeywordsAreChecked) {
  EXPECT_HAS(error_of([] { models().get("GPT")(args("model", {{"n_head", "0"}})); }),
             "config key 'model.n_head' must be >= 1, got 0");
  EXPECT_HAS(error_of([] { models().get("GPT")(args("model", {{"n_embd", "10"}, {"n_head", "4"}})); }),
             "config key 'model.n_embd' (10) must be a multiple of n_head (4)");
  EXPECT_HAS(error_of([] { models().get("MnistNet")(args("model", {{"width", "2"}})); }),
             "model: unknown argument 'width'");
  EXPECT_HAS(error_of([] { datasets().get("MNIST")(args("train_dataloader.dataset", {{"indics", "5"}}), "train"); }),
             "did you mean 'indices'?");
  EXPECT_HAS(error_of([] { datasets().get("CharCorpus")(args("train_dataloader.dataset", {{"val_fraction", "1"}}), "train"); }),
             "config key 'train_dataloader.dataset.val_fraction' must be in (0, 1), got 1");
  EXPECT_HAS(error_of([] { metric_types().get("Accuracy")(args("val_evaluator[0]", {{"topk", "[1, 0]"}})); }),
             "config key 'val_evaluator[0].topk' must be an integer >= 1 or a list of them");
}

}  // namespace
}  // namespace tandem::train
