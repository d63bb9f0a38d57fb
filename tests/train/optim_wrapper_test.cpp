// train/optim_wrapper: OptimWrapper and AmpOptimWrapper built through optim_wrappers() with their
// schemas (MMEngine's names and defaults; one-line errors), MMEngine's accumulation counting, and
// OptimWrapperDict stepping two optimizers of one model, each on its own part.
#include "train/optim_wrapper.h"

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "nn/functional.h"
#include "nn/pointwise.h"
#include "train/registries.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

using test::error_of;

Tensor param(std::vector<float> v) {
  Tensor t = Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size())});
  t.set_requires_grad(true);
  return t;
}

std::unique_ptr<optim::Optimizer> sgd(Tensor p, double lr) {
  return std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions{lr});
}

TEST(OptimWrapper, BuiltThroughTheRegistryWithMMEnginesDefaults) {
  Tensor p = param({3.f, 4.f});
  auto w = optim_wrappers().get("OptimWrapper")(sgd(p, 0.1), Kwargs("optim_wrapper"));
  EXPECT_EQ(w->options().accumulative_counts, 1);
  EXPECT_EQ(w->options().clip_max_norm, 0.0) << "clip_grad None: no clipping";
  EXPECT_FALSE(w->scaler().enabled());
  auto amp = optim_wrappers().get("AmpOptimWrapper")(sgd(p, 0.1), args("optim_wrapper", {{"dtype", "\"float16\""}}));
  EXPECT_TRUE(amp->scaler().enabled()) << "float16: dynamic loss scaling";
  auto bf16 = optim_wrappers().get("AmpOptimWrapper")(sgd(p, 0.1), args("optim_wrapper", {{"dtype", "\"bfloat16\""}}));
  EXPECT_FALSE(bf16->scaler().enabled());
  ASSERT_NE(optim_wrappers().schema("AmpOptimWrapper"), nullptr);
  EXPECT_HAS(describe_schema(*optim_wrappers().schema("AmpOptimWrapper")), "loss_scale (any value, default \"dynamic\"): the float16 loss scaler: 'dynamic', a number");
}

TEST(OptimWrapper, BadKeywordsAreOneLineErrors) {
  Tensor p = param({1.f});
  const OptimWrapperFactory plain = optim_wrappers().get("OptimWrapper");
  EXPECT_HAS(error_of([&] { plain(sgd(p, 0.1), args("optim_wrapper", {{"accumulative_count", "2"}})); }),
             "optim_wrapper: unknown argument 'accumulative_count' (did you mean 'accumulative_counts'?)");
  EXPECT_HAS(error_of([&] { plain(sgd(p, 0.1), args("optim_wrapper", {{"accumulative_counts", "0"}})); }),
             "config key 'optim_wrapper.accumulative_counts' must be >= 1, got 0");
  EXPECT_HAS(error_of([&] { plain(sgd(p, 0.1), args("optim_wrapper", {{"dtype", "\"float16\""}})); }),
             "unknown argument 'dtype'") << "dtype is AmpOptimWrapper's";
  EXPECT_HAS(error_of([&] { plain(sgd(p, 0.1), args("optim_wrapper", {{"clip_grad", R"({"norm_type": 2})"}})); }),
             "config key 'optim_wrapper.clip_grad.max_norm' is required");
  EXPECT_HAS(error_of([&] { plain(sgd(p, 0.1), args("optim_wrapper", {{"clip_grad", R"({"max_norm": -1})"}})); }),
             "config key 'optim_wrapper.clip_grad.max_norm' must be > 0, got -1");
  EXPECT_HAS(error_of([&] {
               optim_wrappers().get("AmpOptimWrapper")(sgd(p, 0.1), args("optim_wrapper", {{"dtype", "\"fp8\""}}));
             }),
             "config key 'optim_wrapper.dtype' must be one of float16, bfloat16; got \"fp8\"");
}

// 5 iterations, accumulative_counts 2: groups {1,2}, {3,4} and the short last {5}: the loss is
// halved in the full groups and not in the last; syncs and steps after passes 2, 4 and 5.
TEST(OptimWrapper, AccumulationCountsAsMMEngine) {
  Tensor p = param({1.f});
  auto w = optim_wrappers().get("OptimWrapper")(sgd(p, 1.0), args("optim_wrapper", {{"accumulative_counts", "2"}}));
  w->initialize_count_status(0, 5);
  std::vector<bool> syncs, updates;
  std::vector<float> scaled;
  for (int i = 0; i < 5; ++i) {
    syncs.push_back(w->should_sync());
    const Tensor loss = F::sum(F::mul(p, p));  // 1 * 1 = 1 while p stays 1 (lr 1 moves it; checked below)
    scaled.push_back(w->scale_loss(Tensor::ones({1})).to_vector<float>()[0]);
    w->backward(loss);
    updates.push_back(w->should_update());
    if (updates.back()) {
      w->step();
      w->zero_grad(true);
    }
  }
  EXPECT_EQ(syncs, std::vector<bool>({false, true, false, true, true}));
  EXPECT_EQ(updates, std::vector<bool>({false, true, false, true, true}));
  EXPECT_EQ(scaled, std::vector<float>({0.5f, 0.5f, 0.5f, 0.5f, 1.f}));
  EXPECT_EQ(w->inner_count(), 5);
}

TEST(OptimWrapper, ClippingUsesTheGivenNormBeforeTheStep) {
  Tensor p = param({3.f, 4.f});
  auto w = optim_wrappers().get("OptimWrapper")(sgd(p, 1.0), args("optim_wrapper", {{"clip_grad", R"({"max_norm": 1.0})"}}));
  w->initialize_count_status(0, 1);
  w->backward(F::scale(F::sum(F::mul(p, p)), 0.5));  // grad = p = (3, 4), norm 5
  ASSERT_TRUE(w->should_update());
  EXPECT_NEAR(w->step(), 5.0, 1e-6);
  const std::vector<float> after = p.detach().to_vector<float>();
  EXPECT_NEAR(after[0], 3.f - 0.6f, 1e-5) << "the gradient was clipped to norm 1 before the step";
  EXPECT_NEAR(after[1], 4.f - 0.8f, 1e-5);
}

// A model with two optimizers (a generator and a discriminator part) in a program's own loop: its
// own step updates each through the wrapper dict built from one wrapper config per name.
class TwoPartModel {
 public:
  Tensor gen = param({1.f, 2.f}), disc = param({-1.f});
  void train_step(OptimWrapperDict& w) {
    // [optim-wrapper-step]
    OptimWrapper& g = w.at("gen");
    g.backward(F::sum(F::mul(gen, gen)));  // d/dgen = 2 gen
    g.step();
    g.zero_grad(true);
    // [optim-wrapper-step]
    OptimWrapper& d = w.at("disc");
    d.backward(F::sum(F::mul(disc, disc)));
    d.step();
    d.zero_grad(true);
  }
};

TEST(OptimWrapperDict, EachNamedWrapperStepsItsOwnPart) {
  TwoPartModel m;
  // [optim-wrapper-dict]
  OptimWrapperDict w = build_optim_wrapper_dict(
      {{"gen", R"({"type": "OptimWrapper", "optimizer": {"type": "SGD", "lr": 0.25}})"},
       {"disc", R"({"type": "OptimWrapper", "optimizer": {"type": "Adam", "lr": 0.1}, "clip_grad": {"max_norm": 10}})"}},
      [&](const std::string& name) { return std::vector<Tensor>{name == "gen" ? m.gen : m.disc}; });
  // [optim-wrapper-dict]
  EXPECT_EQ(w.names(), std::vector<std::string>({"disc", "gen"}));
  EXPECT_EQ(w.at("gen").optimizer().lr(), 0.25);
  EXPECT_EQ(w.at("disc").options().clip_max_norm, 10.0);
  m.train_step(w);
  EXPECT_EQ(m.gen.detach().to_vector<float>(), std::vector<float>({0.5f, 1.f}));  // SGD: x - 0.25 * 2x
  EXPECT_NEAR(m.disc.detach().to_vector<float>()[0], -0.9f, 1e-5) << "Adam's first step moves by lr";
  EXPECT_HAS(error_of([&] { w.at("generator"); }), "optim_wrapper has no wrapper 'generator'; it has: disc, gen");
  EXPECT_HAS(error_of([&] {
               build_optim_wrapper_dict({{"gen", R"({"type": "OptimWrapper", "optimizer": {"type": "SGD", "lrr": 1}})"}},
                                        [&](const std::string&) { return std::vector<Tensor>{m.gen}; });
             }),
             "optim_wrapper.gen.optimizer: unknown argument 'lrr' (did you mean 'lr'?)");
}


// A wrapper an embedding program registers is what the Runner steps through when the options
// (or the config's optim_wrapper.type) name it.
TEST(OptimWrapper, TheRunnerBuildsTheNamedRegisteredWrapper) {
  static int built = 0;
  if (!optim_wrappers().contains("CountingOptimWrapper"))
    optim_wrappers().register_module(
        "CountingOptimWrapper",
        [](std::unique_ptr<optim::Optimizer> opt, const Kwargs& k) {
          ++built;
          OptimWrapperOptions o;
          o.accumulative_counts = k.integer("accumulative_counts", 1);
          return std::make_unique<OptimWrapper>(std::move(opt), o);
        },
        Schema{at_least(arg_int("accumulative_counts", 1, "backward passes per step"), 1)});
  test::TempDir tmp("optim_wrapper");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.optim_wrapper = "CountingOptimWrapper";
  Runner r(o);
  ASSERT_EQ(r.train(), 0);
  EXPECT_EQ(built, 1);
  EXPECT_EQ(r.optim_wrapper().inner_count(), r.max_iters()) << "every iteration went through it";
  RunnerOptions amp = tiny_options(tmp.file("amp"));
  amp.optim_wrapper = "OptimWrapper";
  amp.amp = "bf16";
  EXPECT_HAS(error_of([&] { Runner(amp).train(); }), "optim_wrapper.type 'OptimWrapper' is float32; amp bf16 needs 'AmpOptimWrapper'");
}

// accumulative_counts is checked once, by the wrapper's schema, for a config and for RunnerOptions.
TEST(OptimWrapper, TheSchemaChecksTheRunnersAccumulativeCounts) {
  test::TempDir tmp("optim_wrapper_counts");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.accumulative_counts = 0;
  EXPECT_HAS(error_of([&] { Runner(o).train(); }), "config key 'optim_wrapper.accumulative_counts' must be >= 1, got 0");
}

}  // namespace
}  // namespace tandem::train
