// Fused relu(batch_norm(x)) kernels (kernels/batch_norm.h: batch_norm_relu_*) against the
// composition of the separate kernels: outputs, saved statistics and running-stat updates, and
// the input/weight/bias gradients, in training and eval, float32 (AVX-512 rows with masked tails)
// and float64, with and without affine parameters, on row lengths below, at and above the SIMD
// width; results bitwise equal on 1, 2 and 3 threads; bad arguments rejected. Through nn:
// BatchNorm2d::forward_relu gives relu(forward) and its autograd gradients, counts the batch, and
// with synced statistics installed goes through the sync strategy (unfused).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "kernel_test_util.h"
#include "kernels/activation.h"
#include "kernels/batch_norm.h"
#include "nn/functional.h"
#include "nn/layers.h"

using namespace tandem;
using namespace tandem::test;

namespace {

void check(const Shape& shape, DType dtype, bool training, bool affine, uint64_t seed) {
  SCOPED_TRACE(shape_str(shape) + (dtype == kFloat32 ? " f32" : " f64") + (training ? " train" : " eval") +
               (affine ? " affine" : " plain"));
  Generator gen(seed);
  const int64_t C = shape[1];
  const Tensor x = random_tensor(shape, dtype, gen, -2.0, 2.0);
  const Tensor gy = random_tensor(shape, dtype, gen);
  const Tensor w = affine ? random_tensor({C}, dtype, gen, 0.5, 1.5) : Tensor();
  const Tensor b = affine ? random_tensor({C}, dtype, gen, -0.5, 0.5) : Tensor();
  const Tensor rm0 = random_tensor({C}, dtype, gen, -0.2, 0.2), rv0 = random_tensor({C}, dtype, gen, 0.5, 2.0);
  const Tol tol = tol_for(dtype);

  Tensor rm_a = rm0.clone(), rv_a = rv0.clone(), rm_b = rm0.clone(), rv_b = rv0.clone();
  const auto ref = kernels::batch_norm_forward(x, w, b, rm_a, rv_a, training, 0.1, 1e-5);
  const Tensor ref_y = kernels::relu_forward(ref.output);
  const auto got = kernels::batch_norm_relu_forward(x, w, b, rm_b, rv_b, training, 0.1, 1e-5);
  EXPECT_TRUE(all_close(got.output, values(ref_y), tol)) << "output";
  EXPECT_TRUE(same_bits(got.save_mean, ref.save_mean));
  EXPECT_TRUE(same_bits(got.save_invstd, ref.save_invstd));
  EXPECT_TRUE(same_bits(rm_b, rm_a) && same_bits(rv_b, rv_a)) << "running statistics";
  // Not all clamped, not all passed: the mask is exercised both ways.
  const std::vector<double> yv = values(got.output);
  const auto zeros = std::count(yv.begin(), yv.end(), 0.0);
  EXPECT_GT(zeros, int64_t(yv.size() / 5));
  EXPECT_LT(zeros, int64_t(yv.size() * 4 / 5));

  const Tensor gy_relu = kernels::relu_backward(gy, ref_y);
  const auto rg = kernels::batch_norm_backward(gy_relu, x, w, ref.save_mean, ref.save_invstd, training, true,
                                               affine, affine);
  const auto gg = kernels::batch_norm_relu_backward(gy, x, w, b, got.save_mean, got.save_invstd, training,
                                                    true, affine, affine);
  EXPECT_TRUE(all_close(gg.input, values(rg.input), tol)) << "input grad";
  if (affine) {
    EXPECT_TRUE(all_close(gg.weight, values(rg.weight), tol)) << "weight grad";
    EXPECT_TRUE(all_close(gg.bias, values(rg.bias), tol)) << "bias grad";
  } else {
    EXPECT_FALSE(gg.weight.defined() || gg.bias.defined());
  }

  // Threads split the images and the sums are added per channel in image order: bits do not depend on
  // the thread count (3 threads: uneven shares).
  for (int threads : {2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    Tensor rm_c = rm0.clone(), rv_c = rv0.clone();
    const auto got2 = kernels::batch_norm_relu_forward(x, w, b, rm_c, rv_c, training, 0.1, 1e-5);
    EXPECT_TRUE(same_bits(got2.output, got.output));
    EXPECT_TRUE(same_bits(got2.save_mean, got.save_mean) && same_bits(got2.save_invstd, got.save_invstd));
    EXPECT_TRUE(same_bits(rm_c, rm_b) && same_bits(rv_c, rv_b)) << "running statistics";
    const auto gg2 = kernels::batch_norm_relu_backward(gy, x, w, b, got.save_mean, got.save_invstd, training, true,
                                                       affine, affine);
    EXPECT_TRUE(same_bits(gg2.input, gg.input));
    if (affine) {
      EXPECT_TRUE(same_bits(gg2.weight, gg.weight) && same_bits(gg2.bias, gg.bias));
    }
  }
}

}  // namespace

TEST(BatchNormRelu, MatchesBatchNormThenRelu) {
  uint64_t seed = 40;
  for (const Shape& shape : {Shape{64, 32, 26, 26}, Shape{8, 6, 11, 11}, Shape{5, 3, 4, 4}, Shape{7, 4, 3, 5}})
    for (DType dtype : {kFloat32, kFloat64})
      for (bool training : {true, false})
        for (bool affine : {true, false}) check(shape, dtype, training, affine, ++seed);
}

TEST(BatchNormRelu, OnlySomeGradients) {
  Generator gen(60);
  const Shape shape{4, 3, 5, 5};
  const Tensor x = random_tensor(shape, kFloat32, gen), gy = random_tensor(shape, kFloat32, gen);
  const Tensor w = Tensor::ones({3}), b = Tensor::zeros({3});
  const auto f = kernels::batch_norm_relu_forward(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5);
  const auto all = kernels::batch_norm_relu_backward(gy, x, w, b, f.save_mean, f.save_invstd, true, true, true, true);
  const auto wonly =
      kernels::batch_norm_relu_backward(gy, x, w, b, f.save_mean, f.save_invstd, true, false, true, false);
  EXPECT_FALSE(wonly.input.defined() || wonly.bias.defined());
  EXPECT_TRUE(same_bits(wonly.weight, all.weight));
  const auto ionly =
      kernels::batch_norm_relu_backward(gy, x, w, b, f.save_mean, f.save_invstd, true, true, false, false);
  EXPECT_TRUE(same_bits(ionly.input, all.input));
}

TEST(BatchNormRelu, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({2, 3, 4, 4});
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_relu_forward(x, Tensor::ones({4}), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
      },
      {"batch_norm_relu_forward", "weight", "[3]"}));
  const auto f = kernels::batch_norm_relu_forward(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_relu_backward(x, x, Tensor(), Tensor::zeros({5}), f.save_mean, f.save_invstd, true,
                                          true, false, false);
      },
      {"batch_norm_relu_backward", "bias", "[3]"}));
}

namespace {

// Records the calls and computes plain batch_norm (stands in for dist::SyncBatchNormStats).
struct CountingSync final : nn::BatchNormStatsSync {
  int calls = 0;
  Tensor forward(nn::BatchNorm2d& bn, const Tensor& x) override {
    ++calls;
    return nn::functional::batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, true, bn.momentum,
                                      bn.eps);
  }
  std::string name() const override { return "CountingSync"; }
};

// Output and gradients (x, weight, bias) of loss = sum(out * gy), out = relu(bn(x)) either way.
std::vector<Tensor> run(nn::BatchNorm2d& bn, const Tensor& x0, const Tensor& gy, bool fused) {
  namespace F = nn::functional;
  Tensor x = x0.clone().set_requires_grad(true);
  const Tensor y = fused ? bn.forward_relu(x) : F::relu(bn.forward(x));
  F::sum(F::mul(y, gy)).backward();
  return {y.detach(), x.grad(), bn.weight.grad().clone(), bn.bias.grad().clone()};
}

}  // namespace

TEST(BatchNormRelu, ModuleForwardReluMatchesReluOfForward) {
  Generator gen(70);
  const Shape shape{6, 4, 7, 9};
  const Tensor x = random_tensor(shape, kFloat32, gen, -2.0, 2.0), gy = random_tensor(shape, kFloat32, gen);
  nn::BatchNorm2d a(4), b(4);
  a.weight.detach().copy_(random_tensor({4}, kFloat32, gen, 0.5, 1.5));
  b.weight.detach().copy_(a.weight.detach());
  const auto ra = run(a, x, gy, /*fused=*/true);
  const auto rb = run(b, x, gy, /*fused=*/false);
  for (size_t i = 0; i < ra.size(); ++i) EXPECT_TRUE(all_close(ra[i], values(rb[i]), tol_for(kFloat32))) << i;
  EXPECT_TRUE(all_close(a.running_mean, values(b.running_mean), tol_for(kFloat32)));
  EXPECT_EQ(a.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{1});
  a.eval();
  b.eval();
  namespace F = nn::functional;
  EXPECT_TRUE(all_close(a.forward_relu(x), values(F::relu(b.forward(x))), tol_for(kFloat32)));
  EXPECT_EQ(a.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{1});  // eval does not count
}

TEST(BatchNormRelu, SyncedStatisticsTakeTheUnfusedPath) {
  Generator gen(71);
  const Tensor x = random_tensor({3, 2, 4, 4}, kFloat32, gen);
  nn::BatchNorm2d bn(2);
  auto sync = std::make_shared<CountingSync>();
  bn.set_stats_sync(sync);
  const Tensor y = bn.forward_relu(x);
  EXPECT_EQ(sync->calls, 1);
  EXPECT_EQ(bn.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{1});
  const std::vector<double> yv = values(y);
  EXPECT_EQ(*std::min_element(yv.begin(), yv.end()), 0.0);
  bn.eval();  // eval never syncs: fused
  bn.forward_relu(x);
  EXPECT_EQ(sync->calls, 1);
}
