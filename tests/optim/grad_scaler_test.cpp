// GradScaler policy against torch.cuda.amp.GradScaler's rules, written out by hand: unscale math,
// skipping on inf/NaN, backoff, growth after growth_interval clean steps, the disabled
// pass-through, and a state_dict round trip; update(new_scale) against
// tests/fixtures/grad_scaler_updates.json (make_grad_scaler_fixtures.py: PyTorch 1.13's
// torch.cuda.amp.GradScaler.update run on CPU tensors, its _amp_update_scale_ kernel written out).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "optim/optim_test_util.h"
#include "optim/grad_scaler.h"

using namespace tandem;

using test::param;
using test::set_grad;

TEST(GradScaler, ScaleMultipliesLossAndBackwardCarriesTheScale) {
  optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 1024.0});
  Tensor w = param({2.0f});
  Tensor loss = Tensor::from_vector<float>({3.0f}, {1}).set_requires_grad(true);
  Tensor scaled = scaler.scale(loss);
  EXPECT_FLOAT_EQ(scaled.to_vector<float>()[0], 3072.0f);
  scaled.backward(Tensor::ones({1}));
  EXPECT_FLOAT_EQ(loss.grad().to_vector<float>()[0], 1024.0f);
}

TEST(GradScaler, StepUnscalesGradsAndSteps) {
  Tensor a = param({1.0f, 2.0f}), b = param({-1.0f});
  optim::SGD opt({a, b}, optim::SGDOptions{.lr = 0.5});
  optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 8.0});
  set_grad(a, {8.0f, -16.0f});
  set_grad(b, {4.0f});
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{0.5f}));
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0.5f, 3.0f}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{-1.25f}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8.0);  // growth_interval 2000 not reached
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(GradScaler, SkipsOnInfAndNanAndBacksOff) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    Tensor a = param({1.0f, 2.0f}), b = param({5.0f});
    Tensor no_grad = param({7.0f});  // no gradient: skipped, as the optimizer skips it
    optim::SGD opt({a, b, no_grad}, optim::SGDOptions{.lr = 1.0});
    optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 4.0, .growth_interval = 1});
    set_grad(a, {4.0f, 4.0f});
    set_grad(b, {bad});
    EXPECT_FALSE(scaler.step(opt)) << bad;
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1.0f, 2.0f})) << "parameters must not move";
    EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{5.0f}));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 2.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
}

TEST(GradScaler, GrowsAfterGrowthIntervalCleanStepsAndTrackerResetsOnSkip) {
  Tensor a = param({0.0f});
  optim::SGD opt({a}, optim::SGDOptions{.lr = 0.0});
  optim::GradScaler scaler(
      optim::GradScalerOptions{.init_scale = 16.0, .growth_factor = 3.0, .backoff_factor = 0.25,
                               .growth_interval = 3});
  auto iteration = [&](float g) {
    set_grad(a, {g});
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  };
  EXPECT_TRUE(iteration(1.0f));
  EXPECT_TRUE(iteration(1.0f));
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_FALSE(iteration(std::numeric_limits<float>::infinity()));  // tracker back to 0
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_TRUE(iteration(1.0f));
  EXPECT_TRUE(iteration(1.0f));
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_TRUE(iteration(1.0f));  // third clean step in a row
  EXPECT_EQ(scaler.get_scale(), 12.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  scaler.update();  // update without a step changes nothing
  EXPECT_EQ(scaler.get_scale(), 12.0);
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Tensor a = param({1.0f});
  optim::SGD opt({a}, optim::SGDOptions{.lr = 1.0});
  optim::GradScaler scaler(optim::GradScalerOptions{.enabled = false});
  EXPECT_FALSE(scaler.enabled());
  Tensor loss = Tensor::from_vector<float>({3.0f}, {1});
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  set_grad(a, {std::numeric_limits<float>::infinity()});
  EXPECT_TRUE(scaler.step(opt));  // no check when disabled, as PyTorch
  EXPECT_TRUE(std::isinf(a.to_vector<float>()[0]));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_TRUE(scaler.state_dict().empty());
}

TEST(GradScaler, StateDictRoundTrip) {
  Tensor a = param({0.0f});
  optim::SGD opt({a}, optim::SGDOptions{.lr = 0.0});
  optim::GradScaler s1(optim::GradScalerOptions{.init_scale = 32.0, .growth_interval = 10});
  for (int i = 0; i < 3; ++i) {
    set_grad(a, {1.0f});
    s1.step(opt);
    s1.update();
  }
  set_grad(a, {std::numeric_limits<float>::quiet_NaN()});
  s1.step(opt);
  s1.update();
  set_grad(a, {1.0f});
  s1.step(opt);
  s1.update();
  auto state = s1.state_dict();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state.at("scale").item<double>(), 16.0);
  EXPECT_EQ(state.at("growth_tracker").item<int64_t>(), 1);

  optim::GradScaler s2(optim::GradScalerOptions{.growth_interval = 10});
  s2.load_state_dict(state);
  EXPECT_EQ(s2.get_scale(), 16.0);
  EXPECT_EQ(s2.growth_tracker(), 1);

  auto missing = state;
  missing.erase("growth_tracker");
  EXPECT_HAS(test::error_of([&] { s2.load_state_dict(missing); }), "growth_tracker");
  auto negative = state;
  negative["scale"] = Tensor::scalar(-1.0, kFloat64);
  EXPECT_HAS(test::error_of([&] { s2.load_state_dict(negative); }), "scale must be positive");
}

TEST(GradScaler, RejectsNonFloat32GradsAndBadOptions) {
  Tensor a = param({1.0f});
  optim::SGD opt({a}, optim::SGDOptions{.lr = 1.0});
  optim::GradScaler scaler;
  a.set_grad(Tensor::from_vector<float>({1.0f}, {1}).to(kBFloat16));
  EXPECT_HAS(test::error_of([&] { scaler.step(opt); }), "must be float32");
  EXPECT_HAS(test::error_of([] { optim::GradScaler s(optim::GradScalerOptions{.backoff_factor = 1.5}); }),
             "backoff_factor");
}

// Each fixture event: a step with finite or overflowing gradients (or none), then update() or
// update(new_scale); the scale and the growth tracker after it are PyTorch's.
TEST(GradScaler, UpdateWithNewScaleMatchesPyTorch) {
  std::ifstream f(TANDEM_SOURCE_DIR "/tests/fixtures/grad_scaler_updates.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json fixture = nlohmann::json::parse(f);
  ASSERT_EQ(fixture["cases"].size(), 4u);
  for (const auto& c : fixture["cases"]) {
    const auto& o = c["options"];
    optim::GradScalerOptions opts;
    opts.init_scale = o["init_scale"].get<double>();
    opts.growth_factor = o.value("growth_factor", opts.growth_factor);
    opts.backoff_factor = o.value("backoff_factor", opts.backoff_factor);
    opts.growth_interval = o.value("growth_interval", opts.growth_interval);
    optim::GradScaler scaler(opts);
    Tensor a = param({1.0f});
    optim::SGD opt({a}, optim::SGDOptions{.lr = 1.0});
    const std::string name = c["name"].get<std::string>();
    for (size_t i = 0; i < c["events"].size(); ++i) {
      const auto& e = c["events"][i];
      if (!e["step"].is_null()) {
        const float before = a.to_vector<float>()[0];
        const bool overflow = e["step"] == "inf";
        set_grad(a, {overflow ? std::numeric_limits<float>::infinity() : 0.0f});
        EXPECT_EQ(scaler.step(opt), !overflow) << name << " event " << i;
        EXPECT_EQ(a.to_vector<float>()[0], before) << name << " event " << i;  // zero grad or skipped
      }
      if (e["new_scale"].is_null())
        scaler.update();
      else
        scaler.update(e["new_scale"].get<double>());
      EXPECT_EQ(scaler.get_scale(), c["after"][i]["scale"].get<double>()) << name << " event " << i;
      EXPECT_EQ(scaler.growth_tracker(), c["after"][i]["growth_tracker"].get<int64_t>()) << name << " event " << i;
    }
  }
}

TEST(GradScaler, UpdateTakesAOneElementTensorAndRejectsBadScales) {
  optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 8.0});
  scaler.update(Tensor::from_vector<float>({2.5f}, {1}));
  EXPECT_EQ(scaler.get_scale(), 2.5);
  scaler.update(Tensor::scalar(0.25, kFloat64));
  EXPECT_EQ(scaler.get_scale(), 0.25);
  EXPECT_HAS(test::error_of([&] { scaler.update(Tensor::from_vector<float>({1.0f, 2.0f}, {2})); }),
             "one-element floating tensor");
  EXPECT_HAS(test::error_of([&] { scaler.update(param({4.0f})); }), "requires_grad false");
  EXPECT_HAS(test::error_of([&] { scaler.update(Tensor::from_vector<int64_t>({4}, {1})); }), "floating tensor");
  EXPECT_HAS(test::error_of([&] { scaler.update(0.0); }), "new_scale must be positive and finite");
  EXPECT_HAS(test::error_of([&] { scaler.update(1e39); }), "new_scale must be positive and finite");
  EXPECT_EQ(scaler.get_scale(), 0.25);  // the refused values left it alone
  optim::GradScaler off(optim::GradScalerOptions{.enabled = false});
  off.update(4.0);  // disabled: a no-op, as PyTorch
  EXPECT_EQ(off.get_scale(), 65536.0);
}
