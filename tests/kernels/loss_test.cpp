// log_softmax over the rows of [N, C] (softmax_forward/backward's fast path) and nll_loss against
// plain references: values and gradients, extreme inputs (shift invariance), non-contiguous inputs,
// out-of-range targets (the error names the row and the value), and argument errors.
#include "kernels/loss.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/reduce.h"

using namespace tandem;
using namespace tandem::test;

namespace {

std::vector<double> ref_log_softmax(const std::vector<double>& x, int64_t N, int64_t C) {
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double m = x[n * C];
    for (int64_t c = 1; c < C; ++c) m = std::max(m, x[n * C + c]);
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[n * C + c] - m);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = x[n * C + c] - m - std::log(s);
  }
  return y;
}

}  // namespace

TEST(LogSoftmax, ForwardAndBackward) {
  for (DType dtype : {kFloat64, kFloat32}) {
    Generator gen(1);
    const int64_t N = 6, C = 10;
    const Tensor x = random_tensor({N, C}, dtype, gen, -5, 5);
    const std::vector<double> y = ref_log_softmax(values(x), N, C);
    const Tol tol = tol_for(dtype);
    const int64_t rows_before = kernels::fast_path_count("log_softmax_forward");
    const Tensor out = kernels::softmax_forward(x, -1, true);
    EXPECT_EQ(kernels::fast_path_count("log_softmax_forward"), rows_before + 1);
    EXPECT_TRUE(all_close(out, y, tol));
    EXPECT_TRUE(all_close(kernels::softmax_forward(non_contiguous(x), 1, true), y, tol));

    // dx = dy - softmax * sum(dy)
    const Tensor gy = random_tensor({N, C}, dtype, gen);
    const std::vector<double> gyv = values(gy);
    std::vector<double> gx(N * C);
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += gyv[n * C + c];
      for (int64_t c = 0; c < C; ++c) gx[n * C + c] = gyv[n * C + c] - std::exp(y[n * C + c]) * s;
    }
    const int64_t back_before = kernels::fast_path_count("log_softmax_backward");
    EXPECT_TRUE(all_close(kernels::softmax_backward(gy, out, 1, true), gx, tol));
    EXPECT_EQ(kernels::fast_path_count("log_softmax_backward"), back_before + 1);
    // Over dim 0 (or softmax without log) the general kernel runs, and the counter stays.
    const int64_t rows_after = kernels::fast_path_count("log_softmax_forward");
    kernels::softmax_forward(x, 0, true);
    kernels::softmax_forward(x, 1, false);
    EXPECT_EQ(kernels::fast_path_count("log_softmax_forward"), rows_after);
  }
}

TEST(LogSoftmax, LargeLogitsStayFinite) {
  const Tensor x = Tensor::from_vector<float>({1000, 1001, 999, -1000, 0, 1}, {2, 3});
  const std::vector<double> y = ref_log_softmax(values(x), 2, 3);
  EXPECT_TRUE(all_close(kernels::softmax_forward(x, 1, true), y, tol_for(kFloat32)));
}

TEST(LogSoftmax, ManyRowsOnSeveralThreads) {
  ThreadCountGuard guard(2);
  Generator gen(2);
  const Tensor x = random_tensor({5000, 10}, kFloat32, gen, -3, 3);
  EXPECT_TRUE(
      all_close(kernels::softmax_forward(x, 1, true), ref_log_softmax(values(x), 5000, 10), tol_for(kFloat32)));
}

TEST(NllLoss, ForwardAndBackward) {
  for (DType dtype : {kFloat64, kFloat32}) {
    Generator gen(3);
    const int64_t N = 7, C = 5;
    const Tensor lp = random_tensor({N, C}, dtype, gen, -4, 0);
    const std::vector<int64_t> t{0, 4, 2, 2, 1, 3, 4};
    const Tensor target = Tensor::from_vector<int64_t>(t, {N});
    const std::vector<double> lpv = values(lp);
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) sum += lpv[n * C + t[n]];
    const Tensor loss = kernels::nll_loss_forward(lp, target, {});
    EXPECT_EQ(loss.dim(), 0);
    EXPECT_EQ(loss.dtype(), dtype);
    EXPECT_TRUE(all_close(loss, {-sum / N}, tol_for(dtype)));
    EXPECT_TRUE(all_close(kernels::nll_loss_forward(non_contiguous(lp), target, {}), {-sum / N}, tol_for(dtype)));

    const double g = 0.75;
    std::vector<double> gx(N * C, 0.0);
    for (int64_t n = 0; n < N; ++n) gx[n * C + t[n]] = -g / N;
    const Tensor go = Tensor::scalar(g, dtype);
    EXPECT_TRUE(all_close(kernels::nll_loss_backward(go, lp, target, {}), gx, tol_for(dtype)));
  }
}

// The general path (class weights, "sum" and "none", a custom ignore_index) against sums written
// out, and the fast path's ignored rows: mean over the kept rows, NaN with a zero gradient when
// none is kept; an ignored row adds nothing even where its log-probability is -inf.
TEST(NllLoss, WeightsReductionsAndIgnoredRows) {
  for (DType dtype : {kFloat64, kFloat32}) {
    Generator gen(4);
    const int64_t N = 6, C = 4;
    const Tensor lp = random_tensor({N, C}, dtype, gen, -4, 0);
    const std::vector<int64_t> t{3, 1, 1, 0, 2, 1};  // ignore_index 1 below
    const Tensor target = Tensor::from_vector<int64_t>(t, {N});
    const Tensor weight = random_tensor({C}, dtype, gen, 0.5, 2.0);
    const std::vector<double> lpv = values(lp), w = values(weight);
    std::vector<double> none(N, 0.0);
    double sum = 0, wsum = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (t[n] == 1) continue;
      none[n] = -w[t[n]] * lpv[n * C + t[n]];
      sum += none[n];
      wsum += w[t[n]];
    }
    using kernels::Reduction;
    EXPECT_TRUE(all_close(kernels::nll_loss_forward(lp, target, {weight, 1, Reduction::None}), none, tol_for(dtype)));
    EXPECT_TRUE(all_close(kernels::nll_loss_forward(lp, target, {weight, 1, Reduction::Sum}), {sum}, tol_for(dtype)));
    EXPECT_TRUE(
        all_close(kernels::nll_loss_forward(lp, target, {weight, 1, Reduction::Mean}), {sum / wsum}, tol_for(dtype)));
    // d mean / d lp[n, t_n] = -w[t_n] / wsum at kept rows, 0 elsewhere
    std::vector<double> gx(N * C, 0.0);
    for (int64_t n = 0; n < N; ++n)
      if (t[n] != 1) gx[n * C + t[n]] = -0.5 * w[t[n]] / wsum;
    EXPECT_TRUE(all_close(kernels::nll_loss_backward(Tensor::scalar(0.5, dtype), lp, target, {weight, 1}), gx,
                          tol_for(dtype)));
    // the fast path with ignore_index 1: mean over the 3 kept rows
    double plain = 0;
    for (int64_t n = 0; n < N; ++n)
      if (t[n] != 1) plain -= lpv[n * C + t[n]];
    EXPECT_TRUE(all_close(kernels::nll_loss_forward(lp, target, {Tensor(), 1}), {plain / 3}, tol_for(dtype)));
    // an ignored row's picked value at -inf (row 1 picks column 0 in the composed path) adds nothing
    std::vector<double> with_inf = lpv;
    with_inf[1 * C + 0] = with_inf[1 * C + 1] = -INFINITY;
    const Tensor lp_inf = Tensor::from_vector<double>(with_inf, {N, C}).to(dtype);
    EXPECT_TRUE(all_close(kernels::nll_loss_forward(lp_inf, target, {weight, 1, Reduction::Sum}), {sum}, tol_for(dtype)));
    EXPECT_TRUE(all_close(kernels::nll_loss_forward(lp_inf, target, {Tensor(), 1}), {plain / 3}, tol_for(dtype)));
    // every row ignored: the means are NaN, the sum 0, every gradient 0
    const auto value = [](const Tensor& x) { return x.to(kFloat64).item<double>(); };
    const Tensor all_ignored = Tensor::full({N}, 1.0, kInt64);
    EXPECT_TRUE(std::isnan(value(kernels::nll_loss_forward(lp, all_ignored, {Tensor(), 1}))));
    EXPECT_TRUE(std::isnan(value(kernels::nll_loss_forward(lp, all_ignored, {weight, 1}))));
    EXPECT_EQ(value(kernels::nll_loss_forward(lp, all_ignored, {weight, 1, Reduction::Sum})), 0.0);
    for (const kernels::NllLossArgs& a : {kernels::NllLossArgs{Tensor(), 1}, kernels::NllLossArgs{weight, 1}}) {
      const Tensor g = kernels::nll_loss_backward(Tensor::scalar(1.0, dtype), lp, all_ignored, a);
      EXPECT_TRUE(all_close(g, std::vector<double>(N * C, 0.0), Tol{0.0, 0.0}));
    }
  }
}

TEST(NllLoss, OutOfRangeTargetNamesRowAndValue) {
  const Tensor lp = Tensor::zeros({3, 4});
  const Tensor high = Tensor::from_vector<int64_t>({0, 1, 7}, {3});
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_forward(lp, high, {}); }, {"target[2] = 7", "[0, 4)"}));
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_backward(Tensor::scalar(1.0), lp, high, {}); }, {"= 7"}));
  const Tensor negative = Tensor::from_vector<int64_t>({-1, 1, 2}, {3});
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_forward(lp, negative, {}); }, {"target[0] = -1"}));
  const Tensor edge = Tensor::from_vector<int64_t>({0, 4, 3}, {3});
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_forward(lp, edge, {}); }, {"target[1] = 4"}));
}

TEST(NllLoss, RejectsBadArguments) {
  const Tensor lp = Tensor::zeros({3, 4});
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_forward(lp, Tensor::zeros({3}, kInt32), {}); }, {"int64"}));
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_forward(lp, Tensor::zeros({2}, kInt64), {}); }, {"[3]"}));
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_forward(Tensor::zeros({3}), Tensor::zeros({3}, kInt64), {}); },
                          {"[N, C]"}));
  EXPECT_TRUE(throws_with(
      [&] { kernels::nll_loss_backward(Tensor::zeros({2}), lp, Tensor::zeros({3}, kInt64), {}); }, {"one value"}));
  const kernels::NllLossArgs none{Tensor(), -100, kernels::Reduction::None};
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_backward(Tensor::scalar(1.0), lp, Tensor::zeros({3}, kInt64), none); },
                          {"[3]"}));
  const kernels::NllLossArgs short_weight{Tensor::ones({3}), -100, kernels::Reduction::Sum};
  EXPECT_TRUE(throws_with([&] { kernels::nll_loss_forward(lp, Tensor::zeros({3}, kInt64), short_weight); },
                          {"weight", "[4]"}));
}
