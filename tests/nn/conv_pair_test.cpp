// F::conv2d_pair (nn/conv_pool.h, kernels/conv_pair.h) against its two convs through autograd
// (F::conv2d twice, x's gradients summed by the engine): the outputs and the 3x3's weight gradient
// bitwise, the projection's at one thread (within rounding at two), x's gradient within float32 rounding
// (the fused kernel sums both convs' contributions in one accumulator), float64 bitwise throughout; one
// Conv2dPairBackward node; the fused stride-2 kernels ran where the build has them (AVX-512), at 1 and 2
// threads; autocast takes the two convs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "kernels/cpu/simd.h"
#include "nn/amp.h"
#include "nn/conv_pool.h"
#include "nn/functional.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem;
namespace F = tandem::nn::functional;

namespace {

using test::same_bits;

Tensor random_t(const Shape& shape, Generator& gen, double lo, double hi, DType dtype) {
  return test::random_tensor(shape, dtype, gen, lo, hi);
}

double largest_difference(const Tensor& x, const Tensor& y) {
  const Tensor a = x.to(kFloat64).contiguous(), b = y.to(kFloat64).contiguous();
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::abs(pa[i] - pb[i]));
  return worst;
}

struct Run {
  Tensor main, projection, gx, gw3, gw1;
  std::string node;
};

// One step of loss = sum(main * r3) + sum(projection * r1) from fresh leaves.
Run step(const Tensor& x0, const Tensor& w30, const Tensor& w10, const Tensor& r3, const Tensor& r1, bool paired) {
  Tensor x = x0.clone(), w3 = w30.clone(), w1 = w10.clone();
  for (Tensor* t : {&x, &w3, &w1}) t->set_requires_grad(true);
  Run out;
  if (paired) {
    auto y = F::conv2d_pair(x, w3, w1);
    out.main = y.main, out.projection = y.projection;
  } else {
    out.main = F::conv2d(x, w3, Tensor(), 2, 1);
    out.projection = F::conv2d(x, w1, Tensor(), 2, 0);
  }
  out.node = out.main.grad_fn() ? out.main.grad_fn()->name() : "";
  F::add(F::sum(F::mul(out.main, r3)), F::sum(F::mul(out.projection, r1))).backward();
  out.gx = x.grad(), out.gw3 = w3.grad(), out.gw1 = w1.grad();
  out.main = out.main.detach(), out.projection = out.projection.detach();
  return out;
}

struct Shape4 {
  Shape x;
  int64_t K3, K1;
};

void expect_pair_matches(const Shape4& s, DType dtype, int threads) {
  SCOPED_TRACE("x " + shape_str(s.x) + ", " + dtype_name(dtype) + ", threads " + std::to_string(threads));
  const int saved = num_threads();
  set_num_threads(threads);
  Generator gen(31);
  const int64_t C = s.x[1], P = (s.x[2] - 1) / 2 + 1, Q = (s.x[3] - 1) / 2 + 1;
  const Tensor x = random_t(s.x, gen, -1, 1, dtype), w3 = random_t({s.K3, C, 3, 3}, gen, -0.3, 0.3, dtype),
               w1 = random_t({s.K1, C, 1, 1}, gen, -0.3, 0.3, dtype);
  const Tensor r3 = random_t({s.x[0], s.K3, P, Q}, gen, -1, 1, dtype), r1 = random_t({s.x[0], s.K1, P, Q}, gen, -1, 1,
                                                                                     dtype);
  const auto before = kernels::cpu::simd_path_count(kernels::cpu::SimdKernel::conv2d_pair_backward,
                                                    kernels::cpu::SimdLevel::avx512);
  const Run got = step(x, w3, w1, r3, r1, true), want = step(x, w3, w1, r3, r1, false);
  const auto fused = kernels::cpu::simd_path_count(kernels::cpu::SimdKernel::conv2d_pair_backward,
                                                   kernels::cpu::SimdLevel::avx512) - before;
  set_num_threads(saved);
  EXPECT_EQ(got.node, "Conv2dPairBackward");
  const bool avx512 = kernels::cpu::compiled_simd_level() == kernels::cpu::SimdLevel::avx512;
  // The fused kernels in float32 (at oneDNN's 16->32, the projection's input gradient added in place).
  EXPECT_EQ(fused, avx512 && dtype == kFloat32 ? 1u : 0u) << "calls of the fused backward";
  EXPECT_TRUE(same_bits(got.main, want.main));
  EXPECT_TRUE(same_bits(got.projection, want.projection));
  EXPECT_TRUE(same_bits(got.gw3, want.gw3));
  // The projection's weight gradient: the fused pass sums per lane over positions, the 1x1 alone by pairs
  // of positions or with its channels in the lanes (kernels/cpu/conv_strided_wgrad.cpp), and on more threads
  // the pair cuts the batch by the two convs' work together, so the sums of N P Q products of |x| <= 1 and
  // |r| <= 1 are added in another grouping; bitwise where the op runs the two convs.
  if (fused == 0) {
    EXPECT_TRUE(same_bits(got.gw1, want.gw1));
  } else {
    EXPECT_LE(largest_difference(got.gw1, want.gw1), double(s.x[0] * P * Q) * 0x1p-23 * 4);
  }
  if (dtype == kFloat64 || fused == 0) {
    EXPECT_TRUE(same_bits(got.gx, want.gx));
    return;
  }
  // x's gradient: each value sums at most K3 + K1 products of |r| <= 1 and |w| <= 0.3 (per tap), so
  // its float32 rounding stays below (K3 * 9 + K1) * 0.3 * 2^-23 whichever way it is summed.
  EXPECT_LE(largest_difference(got.gx, want.gx), double(s.K3 * 9 + s.K1) * 0.3 * 0x1p-23 * 4) << "x's gradient";
  EXPECT_FALSE(same_bits(got.gx, Tensor::zeros(got.gx.shape(), dtype)));
}

TEST(ConvPair, TheTwoConvsThroughAutograd) {
  // The ResNet's 8->16 block shape, odd sides and channel counts off the kernels' blocks, 16->32
  // (oneDNN's size: the two convs inside the op).
  for (const Shape4& s :
       {Shape4{{4, 8, 28, 28}, 16, 16}, Shape4{{3, 5, 9, 11}, 11, 7}, Shape4{{2, 16, 14, 14}, 32, 32}})
    for (DType dtype : {kFloat32, kFloat64})
      for (int threads : {1, 2}) expect_pair_matches(s, dtype, threads);
}

TEST(ConvPair, AutocastTakesTheTwoConvs) {
  Generator gen(32);
  const Tensor x = random_t({2, 8, 12, 12}, gen, -1, 1, kFloat32), w3 = random_t({16, 8, 3, 3}, gen, -1, 1, kFloat32),
               w1 = random_t({16, 8, 1, 1}, gen, -1, 1, kFloat32);
  amp::AutocastGuard guard(amp::Precision::kBFloat16);
  Tensor wr = w3.clone();
  wr.set_requires_grad(true);
  auto y = F::conv2d_pair(x, wr, w1);
  const Tensor want = F::conv2d(x, w3, Tensor(), 2, 1);
  ASSERT_TRUE(y.main.grad_fn());
  EXPECT_NE(y.main.grad_fn()->name(), "Conv2dPairBackward");
  EXPECT_EQ(y.main.dtype(), want.dtype());
  EXPECT_TRUE(same_bits(y.main, want));
}

}  // namespace
