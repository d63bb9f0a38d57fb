// Finite-difference gradient checks in float64 for every differentiable op
// of the MNIST net: the analytic gradient of sum(f(inputs) * R), R a fixed
// random tensor, against central differences.
#include <gtest/gtest.h>

#include <functional>

#include "core/autograd.h"
#include "core/random.h"
#include "nn/functional.h"
#include "nn/gradcheck.h"

using namespace tandem;

using tandem::testing::gradcheck;
using tandem::testing::random_f64;

TEST(GradCheck, Conv2dStrideOneNoPadding) {
  Generator g(1);
  gradcheck([](auto& in) { return F::conv2d(in[0], in[1], in[2], 1, 0); },
            {random_f64({2, 3, 6, 5}, g), random_f64({4, 3, 3, 3}, g), random_f64({4}, g)}, {0, 1, 2});
}

TEST(GradCheck, Conv2dStrideTwoPaddingOne) {
  Generator g(2);
  gradcheck([](auto& in) { return F::conv2d(in[0], in[1], in[2], 2, 1); },
            {random_f64({2, 2, 7, 6}, g), random_f64({3, 2, 3, 3}, g), random_f64({3}, g)}, {0, 1, 2});
}

TEST(GradCheck, Conv2dWithoutBias) {
  Generator g(3);
  gradcheck([](auto& in) { return F::conv2d(in[0], in[1], Tensor(), 1, 1); },
            {random_f64({1, 2, 5, 5}, g), random_f64({2, 2, 3, 3}, g)}, {0, 1});
}

TEST(GradCheck, BatchNormTraining) {
  Generator g(4);
  gradcheck(
      [](auto& in) {
        return F::batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], /*training=*/true, 0.1, 1e-5);
      },
      {random_f64({4, 3, 3, 2}, g), random_f64({3}, g, 0.5, 1.5), random_f64({3}, g)}, {0, 1, 2});
}

TEST(GradCheck, BatchNormEval) {
  Generator g(5);
  Tensor mean = random_f64({3}, g), var = random_f64({3}, g, 0.5, 2.0);
  gradcheck(
      [&](auto& in) { return F::batch_norm(in[0], mean, var, in[1], in[2], /*training=*/false, 0.1, 1e-5); },
      {random_f64({2, 3, 2, 2}, g), random_f64({3}, g, 0.5, 1.5), random_f64({3}, g)}, {0, 1, 2});
}

TEST(GradCheck, Relu) {
  Generator g(6);
  // Keep inputs away from the kink at 0, where the derivative is undefined.
  Tensor x = random_f64({3, 7}, g, 0.1, 1.0);
  for (int64_t i = 0; i < x.numel(); i += 2) x.data<double>()[i] *= -1;
  gradcheck([](auto& in) { return F::relu(in[0]); }, {x}, {0});
}

TEST(GradCheck, MaxPool2d) {
  Generator g(7);
  // Distinct values so no two candidates tie within eps.
  Tensor x = Tensor::empty({2, 2, 6, 5}, kFloat64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = static_cast<double>((i * 37) % 61) / 10.0;
  gradcheck([](auto& in) { return F::max_pool2d(in[0], 2, 2, 0); }, {x.clone()}, {0});
  gradcheck([](auto& in) { return F::max_pool2d(in[0], 3, 2, 1); }, {x.clone()}, {0});
}

TEST(GradCheck, Linear) {
  Generator g(8);
  gradcheck([](auto& in) { return F::linear(in[0], in[1], in[2]); },
            {random_f64({5, 4}, g), random_f64({3, 4}, g), random_f64({3}, g)}, {0, 1, 2});
}

TEST(GradCheck, LogSoftmaxNllLoss) {
  Generator g(9);
  Tensor target = Tensor::from_vector<int64_t>({0, 3, 1, 3, 2}, {5});
  gradcheck([&](auto& in) { return F::nll_loss(F::log_softmax(in[0], -1), target); },
            {random_f64({5, 4}, g, -2.0, 2.0)}, {0});
}

TEST(GradCheck, FlattenAndElementwise) {
  Generator g(10);
  gradcheck([](auto& in) { return F::flatten(F::mul(in[0], in[1]), 1); },
            {random_f64({2, 3, 2}, g), random_f64({2, 3, 2}, g)}, {0, 1});
  gradcheck([](auto& in) { return F::sub(F::scale(in[0], 3.0), in[1]); },
            {random_f64({4}, g), random_f64({4}, g)}, {0, 1});
  gradcheck([](auto& in) { return F::matmul(in[0], in[1]); }, {random_f64({3, 4}, g), random_f64({4, 2}, g)},
            {0, 1});
}
