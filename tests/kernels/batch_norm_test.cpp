// batch_norm forward/backward against plain double-loop references:
// training (batch statistics, biased variance to normalise, running stats
// updated with momentum and the unbiased variance), eval (running stats),
// 2-D and 4-D inputs, affine or not, without running stats, non-contiguous
// input, several threads (bitwise the same on 1, 2 and 3), and argument errors.
#include "kernels/batch_norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

struct Dims {
  int64_t N, C, HW;
};

Dims dims_of(const Shape& s) {
  int64_t hw = 1;
  for (size_t i = 2; i < s.size(); ++i) hw *= s[i];
  return {s[0], s[1], hw};
}

double at(const std::vector<double>& v, const Dims& d, int64_t n, int64_t c, int64_t i) {
  return v[(n * d.C + c) * d.HW + i];
}

struct RefStats {
  std::vector<double> mean, var_biased, var_unbiased;
};

RefStats batch_stats(const std::vector<double>& x, const Dims& d) {
  RefStats s;
  const double M = double(d.N * d.HW);
  for (int64_t c = 0; c < d.C; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.HW; ++i) sum += at(x, d, n, c, i);
    const double mean = sum / M;
    double sq = 0;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.HW; ++i) sq += (at(x, d, n, c, i) - mean) * (at(x, d, n, c, i) - mean);
    s.mean.push_back(mean);
    s.var_biased.push_back(sq / M);
    s.var_unbiased.push_back(sq / (M - 1));
  }
  return s;
}

// y = (x - mean) / sqrt(var + eps) * w + b
std::vector<double> normalise(const std::vector<double>& x, const Dims& d, const std::vector<double>& mean,
                              const std::vector<double>& var, const std::vector<double>& w,
                              const std::vector<double>& b, double eps) {
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t i = 0; i < d.HW; ++i) {
        const double xhat = (at(x, d, n, c, i) - mean[c]) / std::sqrt(var[c] + eps);
        y[(n * d.C + c) * d.HW + i] = xhat * (w.empty() ? 1.0 : w[c]) + (b.empty() ? 0.0 : b[c]);
      }
  return y;
}

struct RefGrads {
  std::vector<double> x, w, b;
};

// Training: with xhat = (x - mean)*invstd over the M = N*HW values of a channel,
// dx = w*invstd/M * (M*dy - sum(dy) - xhat*sum(dy*xhat)); dw = sum(dy*xhat); db = sum(dy).
// Eval: mean/invstd are constants, so dx = dy*w*invstd.
RefGrads ref_backward(const std::vector<double>& gy, const std::vector<double>& x, const Dims& d,
                      const std::vector<double>& mean, const std::vector<double>& var,
                      const std::vector<double>& w, double eps, bool training) {
  RefGrads g{std::vector<double>(x.size()), std::vector<double>(d.C), std::vector<double>(d.C)};
  const double M = double(d.N * d.HW);
  for (int64_t c = 0; c < d.C; ++c) {
    const double invstd = 1.0 / std::sqrt(var[c] + eps);
    const double wc = w.empty() ? 1.0 : w[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.HW; ++i) {
        sum_dy += at(gy, d, n, c, i);
        sum_dy_xhat += at(gy, d, n, c, i) * (at(x, d, n, c, i) - mean[c]) * invstd;
      }
    g.w[c] = sum_dy_xhat;
    g.b[c] = sum_dy;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.HW; ++i) {
        const double dy = at(gy, d, n, c, i);
        const double xhat = (at(x, d, n, c, i) - mean[c]) * invstd;
        g.x[(n * d.C + c) * d.HW + i] =
            training ? wc * invstd / M * (M * dy - sum_dy - xhat * sum_dy_xhat) : dy * wc * invstd;
      }
  }
  return g;
}

void check_training(const Shape& shape, DType dtype, bool affine, bool running, bool non_contig,
                    uint64_t seed) {
  Generator gen(seed);
  const Dims d = dims_of(shape);
  const double momentum = 0.1, eps = 1e-5;
  const Tensor x = random_tensor(shape, dtype, gen, -2.0, 3.0);
  const Tensor w = affine ? random_tensor({d.C}, dtype, gen, 0.5, 1.5) : Tensor();
  const Tensor b = affine ? random_tensor({d.C}, dtype, gen) : Tensor();
  Tensor rm = running ? random_tensor({d.C}, dtype, gen) : Tensor();
  Tensor rv = running ? random_tensor({d.C}, dtype, gen, 0.5, 2.0) : Tensor();
  const std::vector<double> xv = values(x), wv = affine ? values(w) : std::vector<double>(),
                            bv = affine ? values(b) : std::vector<double>();
  const std::vector<double> rm0 = running ? values(rm) : std::vector<double>(),
                            rv0 = running ? values(rv) : std::vector<double>();
  const Tol tol = tol_for(dtype);

  const auto r =
      kernels::batch_norm_forward(non_contig ? non_contiguous(x) : x, w, b, rm, rv, true, momentum, eps);
  const RefStats s = batch_stats(xv, d);
  EXPECT_TRUE(all_close(r.output, normalise(xv, d, s.mean, s.var_biased, wv, bv, eps), tol)) << "output";
  EXPECT_TRUE(all_close(r.save_mean, s.mean, tol)) << "save_mean";
  std::vector<double> invstd;
  for (double v : s.var_biased) invstd.push_back(1.0 / std::sqrt(v + eps));
  EXPECT_TRUE(all_close(r.save_invstd, invstd, tol)) << "save_invstd";
  if (running) {
    std::vector<double> rm1, rv1;
    for (int64_t c = 0; c < d.C; ++c) {
      rm1.push_back((1 - momentum) * rm0[c] + momentum * s.mean[c]);
      rv1.push_back((1 - momentum) * rv0[c] + momentum * s.var_unbiased[c]);
    }
    EXPECT_TRUE(all_close(rm, rm1, tol)) << "running_mean";
    EXPECT_TRUE(all_close(rv, rv1, tol)) << "running_var";
  }

  const Tensor gy = random_tensor(shape, dtype, gen);
  const RefGrads ref = ref_backward(values(gy), xv, d, s.mean, s.var_biased, wv, eps, true);
  const auto g = kernels::batch_norm_backward(non_contig ? non_contiguous(gy) : gy, x, w, r.save_mean,
                                              r.save_invstd, true, true, affine, affine);
  const Tol gtol{tol.atol * 10, tol.rtol * 10};
  EXPECT_TRUE(all_close(g.input, ref.x, gtol)) << "input grad";
  if (affine) {
    EXPECT_TRUE(all_close(g.weight, ref.w, gtol)) << "weight grad";
    EXPECT_TRUE(all_close(g.bias, ref.b, gtol)) << "bias grad";
  } else {
    EXPECT_FALSE(g.weight.defined());
    EXPECT_FALSE(g.bias.defined());
  }
}

}  // namespace

TEST(BatchNorm, TrainingMatchesNaive4d) {
  check_training({4, 3, 5, 6}, kFloat64, true, true, false, 1);
  check_training({4, 3, 5, 6}, kFloat32, true, true, false, 2);
}

TEST(BatchNorm, TrainingMatchesNaive2d) {
  check_training({7, 5}, kFloat64, true, true, false, 3);
  check_training({7, 5}, kFloat32, true, true, false, 4);
}

TEST(BatchNorm, TrainingWithoutAffineOrRunningStats) {
  check_training({3, 4, 3, 3}, kFloat64, false, true, false, 5);
  check_training({3, 4, 3, 3}, kFloat64, true, false, false, 6);
  check_training({3, 4, 3, 3}, kFloat32, false, false, false, 7);
}

TEST(BatchNorm, NonContiguousInput) { check_training({3, 2, 4, 5}, kFloat64, true, true, true, 8); }

TEST(BatchNorm, SeveralThreadsSplitImages) {
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    check_training({8, 6, 30, 30}, kFloat32, true, true, false, 9);
    check_training({8, 6, 30, 30}, kFloat64, true, true, false, 10);
  }
}

TEST(BatchNorm, BitwiseTheSameOnOneTwoOrThreeThreads) {
  // [64, 8, 14, 14]: the images are split (>= 32K elements a share); 3 threads: uneven shares. The
  // statistics and the gradients' sums are added per channel in image order whatever the split.
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype == kFloat32 ? "f32" : "f64");
    Generator gen(12);
    const Shape shape{64, 8, 14, 14};
    const Tensor x = random_tensor(shape, dtype, gen, -2.0, 3.0), gy = random_tensor(shape, dtype, gen);
    const Tensor w = random_tensor({8}, dtype, gen, 0.5, 1.5), b = random_tensor({8}, dtype, gen);
    auto run = [&](int threads) {
      ThreadCountGuard guard(threads);
      Tensor rm = Tensor::zeros({8}, dtype), rv = Tensor::ones({8}, dtype);
      const auto f = kernels::batch_norm_forward(x, w, b, rm, rv, true, 0.1, 1e-5);
      const auto g = kernels::batch_norm_backward(gy, x, w, f.save_mean, f.save_invstd, true, true, true, true);
      return std::vector<Tensor>{f.output, f.save_mean, f.save_invstd, rm, rv, g.input, g.weight, g.bias};
    };
    const std::vector<Tensor> one = run(1);
    for (int threads : {2, 3}) {
      const std::vector<Tensor> got = run(threads);
      for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(same_bits(got[i], one[i])) << threads << " threads, " << i;
    }
  }
}

TEST(BatchNorm, RunningStatsAfterTwoSteps) {
  // PyTorch's BatchNorm2d after two training steps from (0, 1): values
  // written out by the reference formula applied twice.
  Generator gen(11);
  const Shape shape{5, 2, 3, 4};
  const Dims d = dims_of(shape);
  Tensor rm = Tensor::zeros({2}, kFloat64), rv = Tensor::ones({2}, kFloat64);
  std::vector<double> m{0, 0}, v{1, 1};
  for (int step = 0; step < 2; ++step) {
    const Tensor x = random_tensor(shape, kFloat64, gen, -1.0, 4.0);
    kernels::batch_norm_forward(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5);
    const RefStats s = batch_stats(values(x), d);
    for (int c = 0; c < 2; ++c) {
      m[c] = 0.9 * m[c] + 0.1 * s.mean[c];
      v[c] = 0.9 * v[c] + 0.1 * s.var_unbiased[c];
    }
  }
  EXPECT_TRUE(all_close(rm, m, tol_for(kFloat64)));
  EXPECT_TRUE(all_close(rv, v, tol_for(kFloat64)));
}

TEST(BatchNorm, EvalUsesRunningStats) {
  for (DType dtype : {kFloat64, kFloat32}) {
    Generator gen(12);
    const Shape shape{3, 4, 2, 5};
    const Dims d = dims_of(shape);
    const double eps = 1e-3;
    const Tensor x = random_tensor(shape, dtype, gen);
    const Tensor w = random_tensor({4}, dtype, gen, 0.5, 1.5), b = random_tensor({4}, dtype, gen);
    Tensor rm = random_tensor({4}, dtype, gen), rv = random_tensor({4}, dtype, gen, 0.5, 2.0);
    const std::vector<double> rm0 = values(rm), rv0 = values(rv);
    const auto r = kernels::batch_norm_forward(x, w, b, rm, rv, false, 0.1, eps);
    const Tol tol = tol_for(dtype);
    EXPECT_TRUE(all_close(r.output, normalise(values(x), d, rm0, rv0, values(w), values(b), eps), tol));
    EXPECT_EQ(values(rm), rm0) << "eval must not touch the running mean";
    EXPECT_EQ(values(rv), rv0) << "eval must not touch the running var";
    EXPECT_TRUE(all_close(r.save_mean, rm0, tol));

    const Tensor gy = random_tensor(shape, dtype, gen);
    const RefGrads ref = ref_backward(values(gy), values(x), d, rm0, rv0, values(w), eps, false);
    const auto g =
        kernels::batch_norm_backward(gy, x, w, r.save_mean, r.save_invstd, false, true, true, true);
    EXPECT_TRUE(all_close(g.input, ref.x, tol));
    EXPECT_TRUE(all_close(g.weight, ref.w, tol));
    EXPECT_TRUE(all_close(g.bias, ref.b, tol));
  }
}

TEST(BatchNorm, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({2, 3, 4, 4});
  const Tensor c3 = Tensor::zeros({3}), c4 = Tensor::zeros({4});
  EXPECT_TRUE(throws_with([&] { kernels::batch_norm_forward(x, c4, c3, c3, c3, true, 0.1, 1e-5); },
                          {"weight", "[3]"}));
  EXPECT_TRUE(throws_with([&] { kernels::batch_norm_forward(x, c3, c3, c3, Tensor(), true, 0.1, 1e-5); },
                          {"running_mean and running_var"}));
  EXPECT_TRUE(throws_with(
      [&] { kernels::batch_norm_forward(x, c3, c3, Tensor(), Tensor(), false, 0.1, 1e-5); }, {"eval"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_forward(Tensor::zeros({1, 3}), c3, c3, c3, c3, true, 0.1, 1e-5);
      },
      {"more than 1 value per channel"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_forward(Tensor::zeros({5}), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1,
                                    1e-5);
      },
      {"at least 2 dimensions"}));
  EXPECT_TRUE(throws_with(
      [&] { kernels::batch_norm_forward(x, c3.to(kFloat64), c3, c3, c3, true, 0.1, 1e-5); }, {"float32"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::batch_norm_backward(Tensor::zeros({2, 3, 4}), x, c3, c3, c3, true, true, true, true);
      },
      {"grad_out"}));
}
