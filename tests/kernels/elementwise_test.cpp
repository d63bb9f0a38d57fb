// The elementwise fast paths (kernels/ops.h, TANDEM_OPS_FAST_PATHS: add, sub, mul, scale, sum,
// argmax) through the general entry points that take them (binary, binary with a scalar, sum_dims
// over every dimension, argmax_dim of [N, C] over dim 1), against plain loops: float32/float64,
// non-contiguous operands, large sums (accuracy and thread split), argmax ties and NaN (PyTorch:
// first maximum, NaN wins), argument errors, and the fast-path counters.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"

using namespace tandem;
using namespace tandem::test;
using kernels::BinaryOp;

namespace {

Tensor add(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::Mul, a, b); }
Tensor scale(const Tensor& a, double s) { return kernels::binary(BinaryOp::Mul, a, s); }
Tensor sum(const Tensor& a) { return kernels::sum_dims(a, {}, false); }
Tensor argmax(const Tensor& a) { return kernels::argmax_dim(a, 1, false); }

}  // namespace

TEST(Elementwise, BinaryAndScale) {
  for (DType dtype : {kFloat64, kFloat32}) {
    Generator gen(1);
    const Shape s{4, 3, 5};
    const Tensor a = random_tensor(s, dtype, gen), b = random_tensor(s, dtype, gen);
    const std::vector<double> av = values(a), bv = values(b);
    std::vector<double> sum, diff, prod, scaled;
    for (size_t i = 0; i < av.size(); ++i) {
      sum.push_back(av[i] + bv[i]);
      diff.push_back(av[i] - bv[i]);
      prod.push_back(av[i] * bv[i]);
      scaled.push_back(av[i] * -2.5);
    }
    const Tol tol = tol_for(dtype);
    EXPECT_TRUE(all_close(add(a, b), sum, tol));
    EXPECT_TRUE(all_close(sub(a, b), diff, tol));
    EXPECT_TRUE(all_close(mul(a, b), prod, tol));
    EXPECT_TRUE(all_close(scale(a, -2.5), scaled, tol));
    EXPECT_EQ(add(a, b).shape(), s);
  }
}

TEST(Elementwise, NonContiguousOperands) {
  Generator gen(2);
  const Tensor a = random_tensor({6, 7}, kFloat64, gen), b = random_tensor({6, 7}, kFloat64, gen);
  const std::vector<double> av = values(a), bv = values(b);
  std::vector<double> diff;
  for (size_t i = 0; i < av.size(); ++i) diff.push_back(av[i] - bv[i]);
  EXPECT_TRUE(all_close(sub(non_contiguous(a), b), diff, Tol{0, 0}));
  EXPECT_TRUE(all_close(sub(a, non_contiguous(b)), diff, Tol{0, 0}));
}

TEST(Elementwise, Sum) {
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    for (DType dtype : {kFloat64, kFloat32}) {
      Generator gen(3);
      for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{300001}}) {
        const Tensor a = random_tensor({n}, dtype, gen);
        double ref = 0;
        for (double v : values(a)) ref += v;
        const Tensor s = sum(a);
        EXPECT_EQ(s.dim(), 0);
        EXPECT_TRUE(all_close(s, {ref}, tol_for(dtype))) << "n " << n;
      }
    }
  }
  // A large float sum of a constant: exact to float precision.
  const Tensor ones = Tensor::full({1 << 22}, 0.1);
  EXPECT_NEAR(sum(ones).item<float>(), 0.1f * (1 << 22), 1e-6 * 0.1 * (1 << 22));
}

TEST(Elementwise, Argmax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = Tensor::from_vector<float>({1, 3, 3, 0,      //
                                               -1, -2, -3, -4,  //
                                               0, nan, 5, nan,  //
                                               2, 2, 2, 2},
                                              {4, 4});
  const Tensor r = argmax(a);
  EXPECT_EQ(r.dtype(), kInt64);
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 0}));
  Generator gen(4);
  const Tensor b = random_tensor({50, 7}, kFloat64, gen);
  const std::vector<double> bv = values(b);
  std::vector<int64_t> ref;
  for (int64_t n = 0; n < 50; ++n) {
    int64_t best = 0;
    for (int64_t c = 1; c < 7; ++c)
      if (bv[n * 7 + c] > bv[n * 7 + best]) best = c;
    ref.push_back(best);
  }
  EXPECT_EQ(argmax(b).to_vector<int64_t>(), ref);
  EXPECT_EQ(argmax(non_contiguous(b)).to_vector<int64_t>(), ref);
}

TEST(Elementwise, RejectsBadArguments) {
  EXPECT_TRUE(throws_with([&] { add(Tensor::zeros({3}), Tensor::zeros({4})); }, {"do not broadcast"}));
  EXPECT_TRUE(
      throws_with([&] { mul(Tensor::zeros({3}), Tensor::zeros({3}, kFloat64)); }, {"float32"}));
  EXPECT_TRUE(throws_with([&] { sum(Tensor::zeros({3}, kInt64)); }, {"int64"}));
  EXPECT_TRUE(throws_with([&] { argmax(Tensor::zeros({3})); }, {"argmax", "dimension 1 out of range"}));
  EXPECT_TRUE(throws_with([&] { argmax(Tensor::zeros({3, 0})); }, {"empty"}));
  EXPECT_TRUE(throws_with([&] { scale(Tensor::zeros({3}, kInt64), 2.0); }, {"int64"}));
  EXPECT_TRUE(throws_with([&] { kernels::cpu_backend().scale(Tensor::zeros({3}, kUInt8), 2.0); }, {"uint8"}));
}

// Each general entry point takes its fast path exactly where the operands allow it, and counts it.
TEST(Elementwise, GeneralEntryPointsCountTheirFastPaths) {
  const auto count = [](const char* op) { return kernels::fast_path_count(op); };
  const Tensor a = Tensor::full({4, 3}, 2.0), row = Tensor::full({3}, 1.0);
  const struct {
    const char* path;
    std::function<Tensor()> fast, general;
  } cases[] = {
      {"add", [&] { return add(a, a); }, [&] { return add(a, row); }},
      {"sub", [&] { return sub(a, a); }, [&] { return sub(a, row); }},
      {"mul", [&] { return mul(a, a); }, [&] { return mul(a, row); }},
      {"scale", [&] { return scale(a, 3.0); }, [&] { return kernels::binary(BinaryOp::Add, a, 3.0); }},
      {"sum", [&] { return kernels::sum_dims(a, {0, 1}, true); }, [&] { return kernels::sum_dims(a, {0}, false); }},
      {"argmax", [&] { return argmax(a); }, [&] { return kernels::argmax_dim(a, 0, false); }},
  };
  for (const auto& c : cases) {
    const int64_t before = count(c.path);
    c.fast();
    EXPECT_EQ(count(c.path), before + 1) << c.path;
    c.general();
    EXPECT_EQ(count(c.path), before + 1) << c.path << ": the general case took the fast path";
  }
  EXPECT_EQ(kernels::sum_dims(a, {0, 1}, true).shape(), (Shape{1, 1}));
  EXPECT_EQ(values(kernels::sum_dims(a, {-1, 0}, true)), std::vector<double>{24.0});
  EXPECT_EQ(kernels::argmax_dim(a, -1, true).shape(), (Shape{4, 1}));
  EXPECT_EQ(values(kernels::binary(BinaryOp::Add, a, 3.0)), std::vector<double>(12, 5.0));
  EXPECT_EQ(count("no_such_op"), -1);
}
