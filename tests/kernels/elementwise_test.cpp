// add/sub/mul/scale/sum/argmax against plain loops: float32/float64,
// non-contiguous operands, large sums (accuracy and thread split), argmax
// ties and NaN (PyTorch: first maximum, NaN wins), and argument errors.
#include "kernels/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/ops.h"

using namespace tandem;
using namespace tandem::test;

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
    EXPECT_TRUE(all_close(kernels::add(a, b), sum, tol));
    EXPECT_TRUE(all_close(kernels::sub(a, b), diff, tol));
    EXPECT_TRUE(all_close(kernels::mul(a, b), prod, tol));
    EXPECT_TRUE(all_close(kernels::scale(a, -2.5), scaled, tol));
    EXPECT_EQ(kernels::add(a, b).shape(), s);
  }
}

TEST(Elementwise, NonContiguousOperands) {
  Generator gen(2);
  const Tensor a = random_tensor({6, 7}, kFloat64, gen), b = random_tensor({6, 7}, kFloat64, gen);
  const std::vector<double> av = values(a), bv = values(b);
  std::vector<double> diff;
  for (size_t i = 0; i < av.size(); ++i) diff.push_back(av[i] - bv[i]);
  EXPECT_TRUE(all_close(kernels::sub(non_contiguous(a), b), diff, Tol{0, 0}));
  EXPECT_TRUE(all_close(kernels::sub(a, non_contiguous(b)), diff, Tol{0, 0}));
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
        const Tensor s = kernels::sum(a);
        EXPECT_EQ(s.dim(), 0);
        EXPECT_TRUE(all_close(s, {ref}, tol_for(dtype))) << "n " << n;
      }
    }
  }
  // A large float sum of a constant: exact to float precision.
  const Tensor ones = Tensor::full({1 << 22}, 0.1);
  EXPECT_NEAR(kernels::sum(ones).item<float>(), 0.1f * (1 << 22), 1e-6 * 0.1 * (1 << 22));
}

TEST(Elementwise, Argmax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = Tensor::from_vector<float>({1, 3, 3, 0,      //
                                               -1, -2, -3, -4,  //
                                               0, nan, 5, nan,  //
                                               2, 2, 2, 2},
                                              {4, 4});
  const Tensor r = kernels::argmax(a);
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
  EXPECT_EQ(kernels::argmax(b).to_vector<int64_t>(), ref);
  EXPECT_EQ(kernels::argmax(non_contiguous(b)).to_vector<int64_t>(), ref);
}

TEST(Elementwise, RejectsBadArguments) {
  EXPECT_TRUE(throws_with([&] { kernels::add(Tensor::zeros({3}), Tensor::zeros({4})); }, {"same shape"}));
  EXPECT_TRUE(
      throws_with([&] { kernels::mul(Tensor::zeros({3}), Tensor::zeros({3}, kFloat64)); }, {"float32"}));
  EXPECT_TRUE(throws_with([&] { kernels::sum(Tensor::zeros({3}, kInt64)); }, {"int64"}));
  EXPECT_TRUE(throws_with([&] { kernels::argmax(Tensor::zeros({3})); }, {"2-D"}));
  EXPECT_TRUE(throws_with([&] { kernels::argmax(Tensor::zeros({3, 0})); }, {"empty"}));
  EXPECT_TRUE(throws_with([&] { kernels::cpu_backend().scale(Tensor::zeros({3}, kUInt8), 2.0); }, {"uint8"}));
}
