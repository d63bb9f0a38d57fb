// The Runner with MMEngine's param_scheduler lists and custom hooks: a warm-up + MultiStepLR list
// gives the lrs worked out by hand and a resumed run repeats a straight run's lrs bit for bit;
// EMAHook's average (exact on dyadic numbers, then through a real run against a hand computation
// from the recorded weights), validation with the averages swapped in and out, its ema_state_dict
// in checkpoints and an exact resume of it; EarlyStoppingHook on a scripted metric sequence and
// through a run.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "common/test_util.h"
#include "train/checkpoint.h"
#include "train/hooks/builtin_hooks.h"
#include "train/hooks/ema.h"
#include "train/registries.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

using test::error_of;
using test::TempDir;

// Records what every iteration saw: its lr, and (after the optimizer step) the weights.
class Watch : public Hook {
 public:
  explicit Watch(int priority) : priority_(priority) {}
  std::string name() const override { return "Watch"; }
  int priority() const override { return priority_; }
  void after_train_iter(Runner& r, const IterOutputs& out) override {
    lrs.push_back(out.lr);
    weights.push_back(flat_params(r));
  }
  void before_val_epoch(Runner& r) override { val_weights.push_back(flat_params(r)); }
  void after_val_epoch(Runner&, const ValMetrics&) override { ++validations; }
  int priority_;
  std::vector<double> lrs;
  std::vector<std::vector<float>> weights, val_weights;
  int validations = 0;
};

SchedulerSpec spec(const std::string& type, const std::map<std::string, std::string>& json_args) {
  SchedulerSpec s{type, Kwargs("param_scheduler." + type)};
  for (const auto& [k, v] : json_args) s.args.set_json(k, v);
  return s;
}

// 2 epochs x 4 iterations, lr 0.5: LinearLR(start 0.25, by iteration, end 3), then MultiStepLR by
// epoch at epoch 1 (x0.1). By hand: 0.5 x 0.25; x(1 + 0.75 / 0.5) = x2.5; x(1 + 0.75 / 1.25) = x1.6
// (back to 0.5); idle at iteration 4; 0.05 for the second epoch.
RunnerOptions warmup_options(const std::string& dir) {
  RunnerOptions o = tiny_options(dir);
  o.max_epochs = 2;
  o.param_schedulers = {spec("LinearLR", {{"start_factor", "0.25"}, {"by_epoch", "false"}, {"end", "3"}}),
                        spec("MultiStepLR", {{"milestones", "[1]"}})};
  return o;
}

TEST(RunnerSchedulers, WarmupThenMultiStepByEpochGivesTheLrsByHand) {
  TempDir tmp("sched");
  Runner r(warmup_options(tmp.file("w")));
  auto w = std::make_shared<Watch>(kHigh);
  r.register_hook(w);
  ASSERT_EQ(r.train(), 0);
  const std::vector<double> want = {0.125, 0.3125, 0.5, 0.5, 0.05, 0.05, 0.05, 0.05};
  ASSERT_EQ(w->lrs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(w->lrs[i], want[i], 1e-15) << i;
}

TEST(RunnerSchedulers, ResumedRunRepeatsTheStraightRunsLrsAndWeightsBitForBit) {
  TempDir tmp("sched");
  RunnerOptions o = warmup_options(tmp.file("straight"));
  o.max_epochs = 3;
  o.param_schedulers.push_back(spec("CosineAnnealingLR", {{"by_epoch", "false"}, {"begin", "2"}}));
  o.checkpoint_interval_iters = 3;
  o.max_keep_ckpts = 0;
  Runner a(o);
  auto wa = std::make_shared<Watch>(kHigh);
  a.register_hook(wa);
  ASSERT_EQ(a.train(), 0);
  RunnerOptions resumed = o;
  resumed.work_dir = tmp.file("resumed");
  resumed.resume = tmp.file("straight") + "/iter_6.safetensors";  // mid-epoch 2, inside the cosine
  Runner b(resumed);
  auto wb = std::make_shared<Watch>(kHigh);
  b.register_hook(wb);
  ASSERT_EQ(b.train(), 0);
  ASSERT_EQ(wa->lrs.size(), 12u);
  ASSERT_EQ(wb->lrs.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(wb->lrs[i], wa->lrs[6 + i]) << i;
    EXPECT_EQ(wb->weights[i], wa->weights[6 + i]) << i;
  }
  EXPECT_NE(wa->lrs[6], wa->lrs[11]);
  RunnerOptions other = resumed;
  other.work_dir = tmp.file("other");
  other.param_schedulers.pop_back();
  EXPECT_HAS(error_of([&] { Runner(other).train(); }), "param_scheduler = \"LinearLR,MultiStepLR,CosineAnnealingLR\"");
}

// Dyadic values, so every float operation is exact whatever the kernels fuse: momentum 0.25,
// averaged 1 -> source 3: 1 + 0.25 x 2 = 1.5, then -> source -1: 1.5 + 0.25 x (-2.5) = 0.875.
TEST(Ema, AverageIsExactOnDyadicValues) {
  ExponentialMovingAverage ema(0.25);
  const auto named = [](float a, float b) {
    return nn::NamedTensors{{"w", Tensor::from_vector(std::vector<float>{a, b}, {2})},
                            {"n", Tensor::from_vector(std::vector<int64_t>{7}, {1})}};
  };
  ema.reset(named(1.f, 8.f));
  ema.update(named(1.f, 8.f));  // steps 0: a copy
  EXPECT_EQ(ema.averaged()[0].second.to_vector<float>(), (std::vector<float>{1.f, 8.f}));
  ema.update(named(3.f, 0.f));
  EXPECT_EQ(ema.averaged()[0].second.to_vector<float>(), (std::vector<float>{1.5f, 6.f}));
  ema.update(named(-1.f, 4.f));
  EXPECT_EQ(ema.averaged()[0].second.to_vector<float>(), (std::vector<float>{0.875f, 5.5f}));
  EXPECT_EQ(ema.averaged()[1].second.to_vector<int64_t>(), (std::vector<int64_t>{7}));  // integers: the first copy
  EXPECT_EQ(ema.steps(), 3);
  nn::NamedTensors model = named(2.f, 2.f);
  ema.swap_with(model);
  EXPECT_EQ(model[0].second.to_vector<float>(), (std::vector<float>{0.875f, 5.5f}));
  EXPECT_EQ(ema.averaged()[0].second.to_vector<float>(), (std::vector<float>{2.f, 2.f}));
  EXPECT_THROW(ExponentialMovingAverage(1.0), Error);
}

RunnerOptions ema_options(const std::string& dir, const std::string& momentum, int64_t begin_iter) {
  RunnerOptions o = tiny_options(dir);
  o.max_epochs = 2;
  HookSpec h{"EMAHook", Kwargs("custom_hooks.EMAHook")};
  h.args.set_json("momentum", momentum);
  h.args.set_json("begin_iter", std::to_string(begin_iter));
  o.custom_hooks.push_back(h);
  return o;
}

TEST(Ema, RunnerAveragesEachIterationValidatesWithTheAveragesAndSavesThem) {
  TempDir tmp("ema");
  Runner r(ema_options(tmp.file("w"), "0.3", 2));
  auto w = std::make_shared<Watch>(kLow);  // before_val_epoch after EMAHook's swap (NORMAL)
  r.register_hook(w);
  ASSERT_EQ(r.train(), 0);
  ASSERT_EQ(w->weights.size(), 8u);
  // By hand: a copy of the weights until iteration 2 (begin_iter; its first update copies too),
  // then avg += 0.3 (w - avg) after every iteration.
  std::vector<double> avg(w->weights[1].begin(), w->weights[1].end());
  std::vector<std::vector<double>> at_epoch_end;
  for (size_t i = 2; i < 8; ++i) {
    for (size_t j = 0; j < avg.size(); ++j) avg[j] += 0.3 * (w->weights[i][j] - avg[j]);
    if (i == 3 || i == 7) at_epoch_end.push_back(avg);
  }
  ASSERT_EQ(w->val_weights.size(), 2u);
  for (size_t v = 0; v < 2; ++v)
    for (size_t j = 0; j < avg.size(); ++j)
      EXPECT_NEAR(w->val_weights[v][j], at_epoch_end[v][j], 1e-6) << "validation " << v << ", weight " << j;
  EXPECT_GT(std::fabs(w->val_weights[1][0] - w->weights[7][0]), 1e-4);  // the average is not the weights
  EXPECT_EQ(flat_params(r), w->weights[7]);                             // swapped back after validation
  const std::string path = r.save_checkpoint(3, 0, tmp.file("end.safetensors"));
  const Checkpoint c = load_checkpoint(path);
  EXPECT_EQ(c.extra.at("ema_state_dict.steps").item<double>(), 7.0);
  const auto saved = c.extra.at("ema_state_dict.module.fc.weight").to_vector<float>();
  for (size_t j = 0; j < saved.size(); ++j) EXPECT_EQ(saved[j], w->val_weights[1][j]) << j;
  EXPECT_EQ(c.weights.at("fc.weight").to_vector<float>()[0], w->weights[7][0]);  // the model's own weights
}

TEST(Ema, ResumedRunEndsWithTheStraightRunsAverageBitForBit) {
  TempDir tmp("ema");
  RunnerOptions o = ema_options(tmp.file("straight"), "0.2", 0);
  o.checkpoint_interval_iters = 3;
  o.max_keep_ckpts = 0;
  Runner a(o);
  ASSERT_EQ(a.train(), 0);
  RunnerOptions resumed = o;
  resumed.work_dir = tmp.file("resumed");
  resumed.resume = tmp.file("straight") + "/iter_3.safetensors";
  Runner b(resumed);
  ASSERT_EQ(b.train(), 0);
  const Checkpoint ca = load_checkpoint(a.save_checkpoint(3, 0, tmp.file("a.safetensors")));
  const Checkpoint cb = load_checkpoint(b.save_checkpoint(3, 0, tmp.file("b.safetensors")));
  EXPECT_EQ(ca.extra.at("ema_state_dict.steps").item<double>(), 8.0);
  for (const auto& [k, t] : ca.extra) EXPECT_EQ(cb.extra.at(k).to_vector<float>(), t.to_vector<float>()) << k;
  Runner plain(tiny_options(tmp.file("plain")));  // a checkpoint without ema_state_dict: EMAHook starts anew
  ASSERT_EQ(plain.train(), 0);
  RunnerOptions from_plain = ema_options(tmp.file("from_plain"), "0.2", 0);
  from_plain.max_epochs = 1;
  from_plain.resume = plain.save_checkpoint(1, 2, tmp.file("p.safetensors"));
  EXPECT_EQ(Runner(from_plain).train(), 0);
}

TEST(Ema, BadArgumentsAreOneLineErrors) {
  Kwargs k("custom_hooks.EMAHook");
  k.set_json("momentun", "0.1");
  const HookFactory make = hooks().get("EMAHook");
  EXPECT_HAS(error_of([&] { make(k); }), "custom_hooks.EMAHook: unknown argument 'momentun' (did you mean 'momentum'?)");
  Kwargs m("custom_hooks.EMAHook");
  m.set_json("momentum", "1.5");
  EXPECT_HAS(error_of([&] { make(m); }), "config key 'custom_hooks.EMAHook.momentum' must be in (0, 1), got 1.5");
  Kwargs b("custom_hooks.EMAHook");
  b.set_json("begin_iter", "2");
  b.set_json("begin_epoch", "1");
  EXPECT_HAS(error_of([&] { make(b); }), "not both");
}

std::shared_ptr<Hook> early(const std::map<std::string, std::string>& json_args) {
  Kwargs k("custom_hooks.EarlyStoppingHook");
  for (const auto& [key, v] : json_args) k.set_json(key, v);
  return hooks().get("EarlyStoppingHook")(k);
}

// loss (rule less, inferred), min_delta 0.1, patience 3: 1.0 is the first best; 0.85 improves on it by
// more than 0.1 (best 0.85); 0.8, 0.78 and 0.76 do not beat 0.85 - 0.1: the third of them stops.
TEST(EarlyStopping, StopsAfterPatienceValidationsWithoutImprovement) {
  TempDir tmp("early");
  Runner r(tiny_options(tmp.file("w")));
  auto hook = early({{"monitor", "\"loss\""}, {"patience", "3"}});
  const std::vector<double> losses = {1.0, 0.85, 0.8, 0.78, 0.76};
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_FALSE(r.training_stopped()) << i;
    hook->after_val_epoch(r, ValMetrics{losses[i], 0.5, 6, 12, {}});
  }
  EXPECT_TRUE(r.training_stopped());
  Runner g(tiny_options(tmp.file("g")));  // accuracy: greater, inferred; an improvement resets the count
  auto acc = early({{"monitor", "\"accuracy\""}, {"patience", "2"}, {"min_delta", "0.01"}});
  for (double a : {0.5, 0.505, 0.6, 0.6}) acc->after_val_epoch(g, ValMetrics{1.0, a, 0, 12, {}});
  EXPECT_FALSE(g.training_stopped());
  acc->after_val_epoch(g, ValMetrics{1.0, 0.605, 0, 12, {}});
  EXPECT_TRUE(g.training_stopped());
  EXPECT_HAS(error_of([] { early({{"monitor", "\"f1\""}}); }), "cannot infer the rule for monitor 'f1'");
  auto strict = early({{"monitor", "\"f1\""}, {"rule", "\"greater\""}, {"strict", "true"}});
  EXPECT_HAS(error_of([&] { strict->after_val_epoch(g, ValMetrics{}); }), "monitor 'f1' is not a validation metric");
}

TEST(EarlyStopping, EndsARunNormallyAfterTheEpochThatStopsIt) {
  TempDir tmp("early");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.max_epochs = 10;
  HookSpec h{"EarlyStoppingHook", Kwargs("custom_hooks.EarlyStoppingHook")};
  h.args.set("monitor", "accuracy");
  h.args.set_json("min_delta", "2");  // no accuracy can improve by 2
  h.args.set_json("patience", "2");
  o.custom_hooks.push_back(h);
  Runner r(o);
  auto w = std::make_shared<Watch>(kHigh);
  r.register_hook(w);
  ASSERT_EQ(r.train(), 0);
  EXPECT_EQ(w->validations, 3);  // the first sets the best, two more without improvement
  EXPECT_EQ(w->lrs.size(), 12u);
}

}  // namespace
}  // namespace tandem::train
