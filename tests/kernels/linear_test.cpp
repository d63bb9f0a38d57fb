// linear forward/backward and matmul against double-loop references: with
// and without bias, gradients asked for selectively, non-contiguous and
// transposed operands, several threads (row-split GEMMs), and errors.
#include "kernels/linear.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

// a [M, K] * b [K, N], b given transposed when b_t ([N, K]).
std::vector<double> ref_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t K,
                           int64_t N, bool b_t) {
  std::vector<double> c(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += a[i * K + k] * (b_t ? b[j * K + k] : b[k * N + j]);
      c[i * N + j] = acc;
    }
  return c;
}

std::vector<double> transpose(const std::vector<double>& a, int64_t R, int64_t C) {
  std::vector<double> t(a.size());
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) t[j * R + i] = a[i * C + j];
  return t;
}

void check_linear(int64_t N, int64_t I, int64_t O, bool bias, DType dtype, bool non_contig, uint64_t seed) {
  Generator gen(seed);
  const Tensor x = random_tensor({N, I}, dtype, gen), w = random_tensor({O, I}, dtype, gen);
  const Tensor b = bias ? random_tensor({O}, dtype, gen) : Tensor();
  const std::vector<double> xv = values(x), wv = values(w);
  const Tol tol = tol_for(dtype);

  std::vector<double> y = ref_mm(xv, wv, N, I, O, true);
  if (bias) {
    const std::vector<double> bv = values(b);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) y[n * O + o] += bv[o];
  }
  const Tensor out =
      kernels::linear_forward(non_contig ? non_contiguous(x) : x, non_contig ? non_contiguous(w) : w, b);
  ASSERT_EQ(out.shape(), (Shape{N, O}));
  EXPECT_TRUE(all_close(out, y, tol)) << "forward";

  const Tensor gy = random_tensor({N, O}, dtype, gen);
  const std::vector<double> gyv = values(gy);
  const std::vector<double> gx = ref_mm(gyv, wv, N, O, I, false);
  const std::vector<double> gw = ref_mm(transpose(gyv, N, O), xv, O, N, I, false);
  std::vector<double> gb(O, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) gb[o] += gyv[n * O + o];

  const auto g = kernels::linear_backward(non_contig ? non_contiguous(gy) : gy, x, w, true, true, bias);
  EXPECT_TRUE(all_close(g.input, gx, tol)) << "input grad";
  EXPECT_TRUE(all_close(g.weight, gw, tol)) << "weight grad";
  if (bias) {
    EXPECT_TRUE(all_close(g.bias, gb, tol)) << "bias grad";
  } else {
    EXPECT_FALSE(g.bias.defined());
  }
  const auto gw_only = kernels::linear_backward(gy, x, w, false, true, false);
  EXPECT_FALSE(gw_only.input.defined());
  EXPECT_TRUE(all_close(gw_only.weight, gw, tol));
}

}  // namespace

TEST(Linear, WithBias) {
  check_linear(5, 7, 3, true, kFloat64, false, 1);
  check_linear(5, 7, 3, true, kFloat32, false, 2);
}

TEST(Linear, WithoutBias) {
  check_linear(4, 6, 9, false, kFloat64, false, 3);
  check_linear(4, 6, 9, false, kFloat32, false, 4);
}

TEST(Linear, NonContiguousOperands) { check_linear(6, 5, 4, true, kFloat64, true, 5); }

TEST(Linear, MnistShapesOnSeveralThreads) {
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    check_linear(64, 1600, 128, true, kFloat32, false, 6);
    check_linear(33, 300, 70, true, kFloat64, false, 7);
    check_linear(64, 128, 10, true, kFloat32, false, 8);
  }
}

TEST(Matmul, PlainAndTransposedOperands) {
  Generator gen(9);
  for (DType dtype : {kFloat64, kFloat32}) {
    const int64_t M = 7, K = 5, N = 6;
    const Tensor a = random_tensor({M, K}, dtype, gen), b = random_tensor({K, N}, dtype, gen);
    const std::vector<double> ref = ref_mm(values(a), values(b), M, K, N, false);
    const Tol tol = tol_for(dtype);
    EXPECT_TRUE(all_close(kernels::matmul(a, b), ref, tol));
    // The transposes of contiguous matrices (as autograd passes them).
    const Tensor at = a.transpose(0, 1).contiguous().transpose(0, 1);
    const Tensor bt = b.transpose(0, 1).contiguous().transpose(0, 1);
    EXPECT_TRUE(all_close(kernels::matmul(at, b), ref, tol));
    EXPECT_TRUE(all_close(kernels::matmul(a, bt), ref, tol));
    EXPECT_TRUE(all_close(kernels::matmul(at, bt), ref, tol));
    // A strided slice (neither layout) is copied.
    const Tensor big = random_tensor({M, 2 * K}, dtype, gen);
    const Tensor sl = big.slice(1, 0, 2 * K, 2);
    EXPECT_TRUE(all_close(kernels::matmul(sl, b), ref_mm(values(sl), values(b), M, K, N, false), tol));
  }
}

TEST(Matmul, LargeOnSeveralThreads) {
  ThreadCountGuard guard(2);
  Generator gen(10);
  const Tensor a = random_tensor({150, 200}, kFloat32, gen), b = random_tensor({200, 90}, kFloat32, gen);
  EXPECT_TRUE(
      all_close(kernels::matmul(a, b), ref_mm(values(a), values(b), 150, 200, 90, false), tol_for(kFloat32)));
}

TEST(Linear, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({2, 3}), w = Tensor::zeros({4, 5});
  EXPECT_TRUE(throws_with([&] { kernels::linear_forward(x, w, Tensor()); }, {"3 features", "5"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::linear_forward(x, Tensor::zeros({4, 3}), Tensor::zeros({3}));
      },
      {"bias", "[4]"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::linear_forward(Tensor::zeros({2, 3, 1}), w, Tensor());
      },
      {"[N, in_features]"}));
  EXPECT_TRUE(throws_with([&] { kernels::matmul(x, w); }, {"inner dimensions"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::linear_backward(Tensor::zeros({2, 5}), x, Tensor::zeros({4, 3}), true, true, true);
      },
      {"grad_out", "[2, 4]"}));
}
