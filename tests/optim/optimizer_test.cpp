// Optimizer classes against PyTorch's update rules, written out by hand in
// double precision for a few steps with changing gradients.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/optim_test_util.h"
#include "optim/optimizer.h"

using namespace tandem;

using test::param;
using test::set_grad;

TEST(Optim, SgdMomentumNesterovWeightDecay) {
  Tensor p = param({1.0f, -2.0f});
  optim::SGD opt({p}, optim::SGDOptions{0.1, 0.9, 0.0, 0.01, true});
  double ref[2] = {1.0, -2.0}, buf[2] = {0, 0};
  const float grads[3][2] = {{0.5f, -1.0f}, {0.25f, 2.0f}, {-1.0f, 0.0f}};
  for (int s = 0; s < 3; ++s) {
    set_grad(p, {grads[s][0], grads[s][1]});
    opt.step();
    for (int i = 0; i < 2; ++i) {
      double d = grads[s][i] + 0.01 * ref[i];
      buf[i] = s == 0 ? d : 0.9 * buf[i] + d;
      d = d + 0.9 * buf[i];
      ref[i] -= 0.1 * d;
    }
  }
  auto got = p.to_vector<float>();
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(got[i], ref[i], 1e-6);
}

TEST(Optim, AdadeltaMatchesPyTorchRule) {
  Tensor p = param({0.5f, 3.0f});
  optim::Adadelta opt({p}, optim::AdadeltaOptions{1.0, 0.9, 1e-6, 0.0});
  double ref[2] = {0.5, 3.0}, sq[2] = {0, 0}, acc[2] = {0, 0};
  const float grads[3][2] = {{1.0f, -0.5f}, {0.2f, 0.1f}, {-0.3f, 0.7f}};
  for (int s = 0; s < 3; ++s) {
    set_grad(p, {grads[s][0], grads[s][1]});
    opt.step();
    for (int i = 0; i < 2; ++i) {
      const double g = grads[s][i];
      sq[i] = 0.9 * sq[i] + 0.1 * g * g;
      const double delta = std::sqrt(acc[i] + 1e-6) / std::sqrt(sq[i] + 1e-6) * g;
      acc[i] = 0.9 * acc[i] + 0.1 * delta * delta;
      ref[i] -= delta;
    }
  }
  auto got = p.to_vector<float>();
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(got[i], ref[i], 1e-5);
}

TEST(Optim, AdamAndAdamW) {
  for (bool decoupled : {false, true}) {
    Tensor p = param({1.0f, -1.0f});
    optim::AdamOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.1;
    o.decoupled_weight_decay = decoupled;
    optim::Adam opt({p}, o);
    double ref[2] = {1.0, -1.0}, m[2] = {0, 0}, v[2] = {0, 0};
    const float grads[3][2] = {{0.3f, -0.2f}, {0.1f, 0.4f}, {-0.5f, 0.05f}};
    for (int s = 0; s < 3; ++s) {
      set_grad(p, {grads[s][0], grads[s][1]});
      opt.step();
      const double bc1 = 1 - std::pow(0.9, s + 1), bc2 = 1 - std::pow(0.999, s + 1);
      for (int i = 0; i < 2; ++i) {
        double g = grads[s][i];
        if (decoupled)
          ref[i] *= 1 - 0.01 * 0.1;
        else
          g += 0.1 * ref[i];
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        ref[i] -= 0.01 / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + 1e-8);
      }
    }
    auto got = p.to_vector<float>();
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(got[i], ref[i], 1e-5) << "decoupled=" << decoupled;
  }
}

TEST(Optim, SkipsParametersWithoutGradient) {
  Tensor a = param({1.0f}), b = param({2.0f});
  optim::SGD opt({a, b}, optim::SGDOptions{0.5});
  set_grad(a, {1.0f});
  opt.step();
  EXPECT_FLOAT_EQ(a.item<float>(), 0.5f);
  EXPECT_FLOAT_EQ(b.item<float>(), 2.0f);
}

TEST(Optim, StepLRDecaysPerStepSize) {
  Tensor p = param({1.0f});
  optim::Adadelta opt({p}, optim::AdadeltaOptions{1.0});
  optim::StepLR sched(opt, 2, 0.5);
  std::vector<double> lrs;
  for (int e = 0; e < 5; ++e) {
    lrs.push_back(opt.lr());
    sched.step();
  }
  EXPECT_EQ(lrs, (std::vector<double>{1.0, 1.0, 0.5, 0.5, 0.25}));
}

TEST(Optim, StateDictRoundTripContinuesIdentically) {
  auto run = [](optim::SGD& opt, Tensor& p, int steps) {
    for (int s = 0; s < steps; ++s) {
      set_grad(p, {0.1f * (s + 1), -0.2f});
      opt.step();
    }
  };
  Tensor p1 = param({1.0f, 2.0f});
  optim::SGD a({p1}, optim::SGDOptions{0.1, 0.9});
  run(a, p1, 2);
  Tensor p2 = param(p1.to_vector<float>());
  optim::SGD b({p2}, optim::SGDOptions{0.1, 0.9});
  b.load_state_dict(a.state_dict());
  // Both continue with the same gradients from the same state.
  for (int s = 0; s < 2; ++s) {
    set_grad(p1, {0.3f, 0.4f});
    set_grad(p2, {0.3f, 0.4f});
    a.step();
    b.step();
  }
  EXPECT_EQ(p1.to_vector<float>(), p2.to_vector<float>());
}

TEST(Optim, RejectsBadOptions) {
  Tensor p = param({1.0f});
  EXPECT_THROW(optim::SGD({p}, optim::SGDOptions{-1.0}), Error);
  EXPECT_THROW(optim::SGD({p}, optim::SGDOptions{0.1, 0.0, 0.0, 0.0, true}), Error);
  Tensor frozen = Tensor::ones({1});
  EXPECT_THROW(optim::SGD({frozen}, optim::SGDOptions{0.1}), Error);
}

TEST(Optim, ZeroGradInPlaceKeepsTheGradientStorage) {
  Tensor p = param({1.0f, 2.0f});
  optim::SGD opt({p}, optim::SGDOptions{0.1});
  set_grad(p, {3.0f, 4.0f});
  const auto storage = p.grad().storage();
  opt.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(p.grad().storage(), storage);
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
}
