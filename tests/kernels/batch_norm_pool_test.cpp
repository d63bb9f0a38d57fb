// Fused max_pool2d(relu(batch_norm(x)), 2) kernels (kernels/batch_norm_pool.h) against the
// composition of the kernels they replace (batch_norm_relu_* then max_pool2d_*): the pooled output
// bitwise, the codes against max_pool2d's indices, the saved and running statistics bitwise, and
// the input/weight/bias gradients within float rounding. Covers MnistNet's shapes, odd H/W (the
// dropped last row/column still gets its batch_norm gradient), batch 1, ties after relu (many
// equal values and zeros: the first maximum wins and alone gets the gradient), NaN, eval mode,
// float32 (the build's vector rows: AVX-512 natively here, AVX2 in CI's x86-64-v3 build, scalar in
// the portable one) and float64 (scalar rows), 1, 2 and 3 threads (bitwise the same), repeated calls
// (bitwise the same), partial gradient requests, finite differences in float64, and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/batch_norm.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/pool.h"

using namespace tandem;
using namespace tandem::test;

namespace {

// Elementwise |got - ref| <= atol + rtol * |ref|, a NaN matching only a NaN.
::testing::AssertionResult close_or_both_nan(const Tensor& got, const Tensor& ref, Tol tol) {
  const std::vector<double> g = values(got), r = values(ref);
  if (g.size() != r.size())
    return ::testing::AssertionFailure() << "sizes " << g.size() << " != " << r.size();
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) || std::isnan(r[i])) {
      if (std::isnan(g[i]) != std::isnan(r[i])) {
        return ::testing::AssertionFailure() << "index " << i << ": got " << g[i] << ", expected " << r[i];
      }
      continue;
    }
    if (!(std::abs(g[i] - r[i]) <= tol.atol + tol.rtol * std::abs(r[i]))) {
      return ::testing::AssertionFailure() << "index " << i << ": got " << g[i] << ", expected " << r[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// The code (0..3 = window position) as max_pool2d's flat index within the input plane.
std::vector<int64_t> code_as_index(const Tensor& code, int64_t W) {
  const int64_t P = code.size(2), Q = code.size(3);
  std::vector<int64_t> out;
  const uint8_t* k = code.data<uint8_t>();
  for (int64_t i = 0; i < code.numel(); ++i) {
    const int64_t p = (i / Q) % P, q = i % Q;
    out.push_back((2 * p + (k[i] >> 1)) * W + 2 * q + (k[i] & 1));
  }
  return out;
}

struct Case {
  Tensor x, gy, w, b, rm, rv;  // gy: the pooled gradient
};

Case make_case(const Shape& shape, DType dtype, bool affine, uint64_t seed, bool quantised = false) {
  Generator gen(seed);
  const int64_t C = shape[1];
  Case c;
  c.x = random_tensor(shape, dtype, gen, -2.0, 2.0);
  if (quantised) {
    // Few distinct values: after batch_norm and relu most windows hold ties, many all zeros.
    std::vector<double> v = values(c.x);
    for (double& e : v) e = std::floor(e * 1.5) / 1.5;
    c.x = Tensor::from_vector<double>(v, shape).to(dtype);
  }
  c.gy = random_tensor({shape[0], C, shape[2] / 2, shape[3] / 2}, dtype, gen);
  c.w = affine ? random_tensor({C}, dtype, gen, 0.5, 1.5) : Tensor();
  c.b = affine ? random_tensor({C}, dtype, gen, -0.5, 0.5) : Tensor();
  c.rm = random_tensor({C}, dtype, gen, -0.2, 0.2);
  c.rv = random_tensor({C}, dtype, gen, 0.5, 2.0);
  return c;
}

// The unfused composition: forward output, indices, saved statistics, running statistics after,
// and the gradients of x, weight, bias for the pooled gradient gy.
struct Reference {
  kernels::BatchNormForward bn;
  kernels::MaxPool2dForward pool;
  Tensor rm, rv;
  kernels::BatchNormGrads grads;
};

Reference reference(const Case& c, bool training, bool need_wb) {
  Reference r;
  r.rm = c.rm.clone();
  r.rv = c.rv.clone();
  r.bn = kernels::batch_norm_relu_forward(c.x, c.w, c.b, r.rm, r.rv, training, 0.1, 1e-5);
  r.pool = kernels::max_pool2d_forward(r.bn.output, kernels::MaxPool2dArgs{});
  const Tensor g_relu = kernels::max_pool2d_backward(c.gy, r.pool.indices, c.x.shape());
  r.grads = kernels::batch_norm_relu_backward(g_relu, c.x, c.w, c.b, r.bn.save_mean, r.bn.save_invstd,
                                              training, true, need_wb, need_wb);
  return r;
}

struct Fused {
  kernels::BatchNormReluPoolForward f;
  Tensor rm, rv;
  kernels::BatchNormGrads grads;
};

Fused fused(const Case& c, bool training, bool need_wb) {
  Fused r;
  r.rm = c.rm.clone();
  r.rv = c.rv.clone();
  r.f = kernels::batch_norm_relu_max_pool2d_forward(c.x, c.w, c.b, r.rm, r.rv, training, 0.1, 1e-5);
  r.grads =
      kernels::batch_norm_relu_max_pool2d_backward(c.gy, c.x, r.f.code, r.f.winner, c.w, c.b, r.f.save_mean,
                                                   r.f.save_invstd, training, true, need_wb, need_wb);
  return r;
}

// Gradients within float rounding of the reference: the sums run in another order.
Tol grad_tol(DType dtype) { return dtype == kFloat64 ? Tol{1e-10, 1e-9} : Tol{2e-4, 2e-4}; }

void check(const Shape& shape, DType dtype, bool training, bool affine, uint64_t seed,
           bool quantised = false) {
  SCOPED_TRACE(shape_str(shape) + (dtype == kFloat32 ? " f32" : " f64") + (training ? " train" : " eval") +
               (affine ? " affine" : " plain") + (quantised ? " quantised" : ""));
  const Case c = make_case(shape, dtype, affine, seed, quantised);
  const Reference ref = reference(c, training, affine);
  const Fused got = fused(c, training, affine);

  EXPECT_TRUE(same_bits(got.f.output, ref.pool.output)) << "pooled output";
  EXPECT_EQ(got.f.code.dtype(), kUInt8);
  EXPECT_EQ(code_as_index(got.f.code, shape[3]), ref.pool.indices.to_vector<int64_t>()) << "argmax";
  // winner: the x value at that position, bitwise.
  const std::vector<int64_t> idx = code_as_index(got.f.code, shape[3]);
  const std::vector<double> xv = values(c.x), wv = values(got.f.winner);
  const int64_t PQ = got.f.code.size(2) * got.f.code.size(3), HW = shape[2] * shape[3];
  for (size_t i = 0; i < idx.size(); ++i) {
    ASSERT_EQ(wv[i], xv[(int64_t(i) / PQ) * HW + idx[i]]) << "winner " << i;
  }
  EXPECT_TRUE(same_bits(got.f.save_mean, ref.bn.save_mean));
  EXPECT_TRUE(same_bits(got.f.save_invstd, ref.bn.save_invstd));
  EXPECT_TRUE(same_bits(got.rm, ref.rm) && same_bits(got.rv, ref.rv)) << "running statistics";
  // Not all clamped, not all passed: the relu mask is exercised both ways.
  const std::vector<double> yv = values(got.f.output);
  const auto zeros = std::count(yv.begin(), yv.end(), 0.0);
  if (yv.size() >= 40) {
    EXPECT_GT(zeros, 0);
  }
  EXPECT_LT(zeros, int64_t(yv.size()));

  EXPECT_TRUE(all_close(got.grads.input, values(ref.grads.input), grad_tol(dtype))) << "input grad";
  if (affine) {
    EXPECT_TRUE(all_close(got.grads.weight, values(ref.grads.weight), grad_tol(dtype))) << "weight grad";
    EXPECT_TRUE(all_close(got.grads.bias, values(ref.grads.bias), grad_tol(dtype))) << "bias grad";
  } else {
    EXPECT_FALSE(got.grads.weight.defined() || got.grads.bias.defined());
  }
}

}  // namespace

TEST(BatchNormReluPool, MatchesTheUnfusedComposition) {
  uint64_t seed = 500;
  for (const Shape& shape : {Shape{8, 6, 11, 11}, Shape{3, 4, 5, 5}, Shape{2, 3, 7, 7}, Shape{4, 2, 4, 6},
                             Shape{2, 2, 2, 2}, Shape{2, 3, 34, 35}, Shape{1, 3, 6, 5}})
    for (DType dtype : {kFloat32, kFloat64})
      for (bool training : {true, false})
        for (bool affine : {true, false}) check(shape, dtype, training, affine, ++seed);
}

TEST(BatchNormReluPool, MnistNetShapes) {
  // [64, 32, 26, 26] -> 13x13 and [64, 64, 11, 11] -> 5x5, as the trainer runs them.
  check({64, 32, 26, 26}, kFloat32, true, true, 601);
  check({64, 64, 11, 11}, kFloat32, true, true, 602);
  check({64, 64, 11, 11}, kFloat32, false, true, 603);
}

TEST(BatchNormReluPool, TiesAfterReluGoToTheFirstMaximum) {
  uint64_t seed = 700;
  for (const Shape& shape : {Shape{6, 3, 26, 26}, Shape{5, 4, 11, 11}, Shape{4, 2, 7, 6}})
    for (DType dtype : {kFloat32, kFloat64})
      for (bool training : {true, false}) check(shape, dtype, training, true, ++seed, /*quantised=*/true);
  // A window of four zeros after relu: position 0 wins, and no gradient flows (relu'(0) = 0).
  const Tensor x = Tensor::from_vector<float>({-1, -2, -3, -4, 1, 2, 3, 4}, {2, 1, 2, 2});
  const Tensor rm = Tensor::zeros({1}), rv = Tensor::ones({1});
  const auto f = kernels::batch_norm_relu_max_pool2d_forward(x, Tensor(), Tensor(), rm, rv, false, 0.1, 1e-5);
  EXPECT_EQ(f.code.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 3}));
  EXPECT_EQ(values(f.output)[0], 0.0);
  const auto g = kernels::batch_norm_relu_max_pool2d_backward(Tensor::ones({2, 1, 1, 1}), x, f.code, f.winner,
                                                              Tensor(), Tensor(), f.save_mean, f.save_invstd,
                                                              false, true, false, false);
  const std::vector<double> gx = values(g.input);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(gx[i], 0.0) << i;
  EXPECT_NEAR(gx[7], 1.0 / std::sqrt(1.0 + 1e-5), 1e-6);
}

TEST(BatchNormReluPool, OddSizesGiveTheDroppedRowAndColumnTheirGradient) {
  const Case c = make_case({3, 2, 7, 5}, kFloat32, true, 800);
  const Reference ref = reference(c, true, true);
  const Fused got = fused(c, true, true);
  EXPECT_TRUE(all_close(got.grads.input, values(ref.grads.input), grad_tol(kFloat32)));
  // The last row (h = 6) and column (w = 4) are outside every window, yet the batch statistics
  // give them a nonzero gradient in training.
  const std::vector<double> gx = values(got.grads.input);
  int nonzero = 0;
  for (int64_t plane = 0; plane < 6; ++plane) {
    for (int64_t w = 0; w < 5; ++w) nonzero += gx[plane * 35 + 6 * 5 + w] != 0.0;
    for (int64_t h = 0; h < 7; ++h) nonzero += gx[plane * 35 + h * 5 + 4] != 0.0;
  }
  EXPECT_EQ(nonzero, 6 * 12);
}

TEST(BatchNormReluPool, NaNCountsAsTheMaximum) {
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype == kFloat32 ? "f32" : "f64");
    Case c = make_case({2, 3, 6, 7}, dtype, true, 900);
    std::vector<double> v = values(c.x);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    v[1] = nan;               // plane 0, window (0, 0), position 1
    v[3 * 7 + 2] = nan;       // plane 0, window (1, 1), position 2 (h = 3, w = 2)
    v[3 * 42 + 7 + 1] = nan;  // plane 3, window (0, 0), position 3
    c.x = Tensor::from_vector<double>(v, c.x.shape()).to(dtype);
    for (bool training : {false, true}) {
      SCOPED_TRACE(training ? "train" : "eval");
      const Reference ref = reference(c, training, true);
      const Fused got = fused(c, training, true);
      EXPECT_TRUE(close_or_both_nan(got.f.output, ref.pool.output, Tol{0, 0}));
      EXPECT_EQ(code_as_index(got.f.code, 7), ref.pool.indices.to_vector<int64_t>());
      const std::vector<uint8_t> k = got.f.code.to_vector<uint8_t>();
      if (!training) {  // running statistics: only the NaN windows are NaN
        EXPECT_EQ(k[0], 1);
        EXPECT_EQ(k[3 + 1], 2);
        EXPECT_EQ(k[3 * 9], 3);
        EXPECT_TRUE(std::isnan(values(got.f.output)[0]));
        // A NaN that wins its window passes its gradient on through relu, as PyTorch's threshold_backward
        // (zero only where the output is <= 0): eval's input gradient there is dy * invstd * weight.
        const double g_nan = values(got.grads.input)[1];
        EXPECT_TRUE(std::isfinite(g_nan) && g_nan != 0.0) << g_nan;
      }
      EXPECT_TRUE(close_or_both_nan(got.grads.input, ref.grads.input, grad_tol(dtype)));
      EXPECT_TRUE(close_or_both_nan(got.grads.weight, ref.grads.weight, grad_tol(dtype)));
      EXPECT_TRUE(close_or_both_nan(got.grads.bias, ref.grads.bias, grad_tol(dtype)));
    }
  }
}

TEST(BatchNormReluPool, BitwiseTheSameOnRepeatAndOnOneTwoOrThreeThreads) {
  // Both shapes big enough that the images are split (>= 32K elements a share); 3 threads: uneven shares.
  for (const Shape& shape : {Shape{16, 8, 26, 26}, Shape{64, 16, 11, 11}}) {
    const Case c = make_case(shape, kFloat32, true, 1000);
    Fused one;
    {
      ThreadCountGuard guard(1);
      one = fused(c, true, true);
    }
    for (int rep = 0; rep < 4; ++rep) {
      ThreadCountGuard guard(rep % 2 == 0 ? 2 : 3);
      const Fused two = fused(c, true, true);
      EXPECT_TRUE(same_bits(two.f.output, one.f.output));
      EXPECT_TRUE(same_bits(two.f.code, one.f.code));
      EXPECT_TRUE(same_bits(two.rm, one.rm) && same_bits(two.rv, one.rv));
      EXPECT_TRUE(same_bits(two.grads.input, one.grads.input));
      EXPECT_TRUE(same_bits(two.grads.weight, one.grads.weight));
      EXPECT_TRUE(same_bits(two.grads.bias, one.grads.bias));
    }
  }
}

TEST(BatchNormReluPool, OnlySomeGradients) {
  const Case c = make_case({4, 3, 6, 6}, kFloat32, true, 1100);
  const Fused all = fused(c, true, true);
  const auto& f = all.f;
  auto run = [&](bool gi, bool gw, bool gb) {
    return kernels::batch_norm_relu_max_pool2d_backward(c.gy, c.x, f.code, f.winner, c.w, c.b, f.save_mean,
                                                        f.save_invstd, true, gi, gw, gb);
  };
  const auto wonly = run(false, true, false);
  EXPECT_FALSE(wonly.input.defined() || wonly.bias.defined());
  EXPECT_TRUE(same_bits(wonly.weight, all.grads.weight));
  const auto ionly = run(true, false, false);
  EXPECT_FALSE(ionly.weight.defined() || ionly.bias.defined());
  EXPECT_TRUE(same_bits(ionly.input, all.grads.input));
  const auto none = run(false, false, false);
  EXPECT_FALSE(none.input.defined() || none.weight.defined() || none.bias.defined());
}

TEST(BatchNormReluPool, FiniteDifferencesInFloat64) {
  // loss = sum(R * pool(relu(bn(x)))) in training mode; central differences against the backward.
  const Case c = make_case({2, 2, 5, 4}, kFloat64, true, 1200);
  auto loss = [&](const Tensor& x, const Tensor& w, const Tensor& b) {
    const auto f = kernels::batch_norm_relu_max_pool2d_forward(x, w, b, Tensor(), Tensor(), true, 0.1, 1e-5);
    const std::vector<double> y = values(f.output), r = values(c.gy);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
    return s;
  };
  const auto f =
      kernels::batch_norm_relu_max_pool2d_forward(c.x, c.w, c.b, Tensor(), Tensor(), true, 0.1, 1e-5);
  const auto g = kernels::batch_norm_relu_max_pool2d_backward(
      c.gy, c.x, f.code, f.winner, c.w, c.b, f.save_mean, f.save_invstd, true, true, true, true);
  const double eps = 1e-6;
  auto numeric = [&](Tensor t, int64_t i) {
    double* p = t.data<double>();
    const double saved = p[i];
    p[i] = saved + eps;
    const double plus = loss(c.x, c.w, c.b);
    p[i] = saved - eps;
    const double minus = loss(c.x, c.w, c.b);
    p[i] = saved;
    return (plus - minus) / (2 * eps);
  };
  const std::vector<double> gx = values(g.input), gw = values(g.weight), gb = values(g.bias);
  for (int64_t i = 0; i < c.x.numel(); ++i)
    EXPECT_NEAR(gx[i], numeric(c.x, i), 1e-6 + 1e-4 * std::abs(gx[i])) << i;
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(gw[i], numeric(c.w, i), 1e-6 + 1e-4 * std::abs(gw[i])) << i;
    EXPECT_NEAR(gb[i], numeric(c.b, i), 1e-6 + 1e-4 * std::abs(gb[i])) << i;
  }
}

TEST(BatchNormReluPool, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({2, 3, 4, 4});
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_relu_max_pool2d_forward(Tensor::zeros({2, 3, 1, 4}), Tensor(), Tensor(), Tensor(),
                                                    Tensor(), true, 0.1, 1e-5);
      },
      {"batch_norm_relu_max_pool2d_forward", "H >= 2"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_relu_max_pool2d_forward(x, Tensor::ones({4}), Tensor(), Tensor(), Tensor(), true,
                                                    0.1, 1e-5);
      },
      {"batch_norm_relu_max_pool2d_forward", "weight", "[3]"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_relu_max_pool2d_forward(x, Tensor(), Tensor(), Tensor(), Tensor(), false, 0.1,
                                                    1e-5);
      },
      {"eval mode", "running_mean"}));
  const auto f =
      kernels::batch_norm_relu_max_pool2d_forward(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5);
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_relu_max_pool2d_backward(x, x, f.code, f.winner, Tensor(), Tensor(), f.save_mean,
                                                     f.save_invstd, true, true, false, false);
      },
      {"batch_norm_relu_max_pool2d_backward", "grad_out", "[2, 3, 2, 2]"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_relu_max_pool2d_backward(f.output, x, f.output, f.winner, Tensor(), Tensor(),
                                                     f.save_mean, f.save_invstd, true, true, false, false);
      },
      {"code", "uint8"}));
}
