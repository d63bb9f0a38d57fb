// What the CUDA kernels promise beyond their values, which tests/gpu/backend_ops_test.cpp checks
// case by case against the CPU: an out-of-range class target reported when the loss is read (the
// deferred kernel-error record), the cached cuDNN algorithms giving the same bits on repeated
// calls, and the dropout mask's distribution and seeding (its draws differ from the CPU's by
// design). Uses only device-neutral entry points; skips without a device (fails under
// TANDEM_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/ops.h"

using namespace tandem;
using namespace tandem::gpu_test;
namespace K = tandem::kernels;

namespace {

TEST(CudaKernelProperties, OutOfRangeTargetIsReportedWhenTheLossIsRead) {
  TANDEM_NEED_GPUS(1);
  Generator gen(3);
  const Tensor lp = K::softmax_forward(random_cpu({6, 10}, gen), 1, true).to(gpu());
  const Tensor bad = Tensor::from_vector<int64_t>({1, 2, 3, 12, 4, 5}, {6}).to(gpu());
  const Tensor loss = K::nll_loss_forward(lp, bad, {});
  EXPECT_TRUE(throws_with([&] { (void)loss.item<float>(); }, {"nll_loss", "12", "row 3", "[0, 10)"}));
  // The report is consumed: correct targets work again, and a negative one is caught too.
  const Tensor good = Tensor::from_vector<int64_t>({1, 2, 3, 9, 4, 5}, {6}).to(gpu());
  EXPECT_TRUE(std::isfinite(K::nll_loss_forward(lp, good, {}).item<float>()));
  const Tensor negative = Tensor::from_vector<int64_t>({0, 0, 0, 0, -1, 0}, {6}).to(gpu());
  const Tensor grad = K::nll_loss_backward(Tensor::ones({}, kFloat32, gpu()), lp, negative, {});
  EXPECT_TRUE(throws_with([&] { (void)grad.to(Device::cpu()); }, {"-1", "row 4"}));
}

TEST(CudaKernelProperties, RepeatedConvolutionsGiveIdenticalResults) {
  TANDEM_NEED_GPUS(1);
  Generator gen(302);
  const Tensor x = random_cpu({4, 8, 12, 12}, gen).to(gpu());
  const Tensor w = random_cpu({16, 8, 3, 3}, gen).to(gpu());
  const Tensor dy = random_cpu({4, 16, 10, 10}, gen).to(gpu());
  const K::Conv2dArgs args;
  const Tensor y1 = K::conv2d_forward(x, w, Tensor(), args);
  const Tensor y2 = K::conv2d_forward(x, w, Tensor(), args);  // cached algorithm
  EXPECT_TRUE(same(y1, y2));
  const K::Conv2dGrads g1 = K::conv2d_backward(dy, x, w, args, true, true, false);
  const K::Conv2dGrads g2 = K::conv2d_backward(dy, x, w, args, true, true, false);
  EXPECT_TRUE(same(g1.input, g2.input));
  EXPECT_TRUE(same(g1.weight, g2.weight));  // a deterministic algorithm was preferred
}

TEST(CudaKernelProperties, DropoutMaskHasTheDistributionAndIsFixedBySeed) {
  TANDEM_NEED_GPUS(1);
  const double p = 0.3;
  const int64_t n = int64_t{1} << 20;
  Generator gen(14);
  const Tensor m = K::dropout_mask({n / 1024, 1024}, p, kFloat32, gpu(), gen);
  ASSERT_TRUE(m.device().is_cuda());
  const std::vector<float> v = m.to_vector<float>();
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  int64_t zeros = 0;
  for (float x : v) {
    ASSERT_TRUE(x == 0.0f || x == keep) << x;
    zeros += x == 0.0f;
  }
  // Bernoulli(p) over 2^20 elements: standard deviation 4.5e-4 in the fraction; 0.005 is 11 of them.
  EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(n), p, 0.005);
  // Neighbouring elements are independent: the fraction of zero pairs is p^2.
  int64_t pairs = 0;
  for (size_t i = 0; i + 1 < v.size(); i += 2) pairs += v[i] == 0.0f && v[i + 1] == 0.0f;
  EXPECT_NEAR(static_cast<double>(pairs) / static_cast<double>(n / 2), p * p, 0.005);
  // The seed fixes the mask; the generator advances, so the next mask differs.
  Generator again(14);
  EXPECT_TRUE(same(K::dropout_mask({n / 1024, 1024}, p, kFloat32, gpu(), again), m));
  EXPECT_FALSE(same(K::dropout_mask({n / 1024, 1024}, p, kFloat32, gpu(), again), m));
}

}  // namespace
