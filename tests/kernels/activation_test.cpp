// relu forward/backward against the plain definition, on contiguous and
// non-contiguous inputs, float32/float64, small and pool-splitting sizes.
#include "kernels/activation.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

void check(const Shape& s, DType dtype, bool non_contig, uint64_t seed) {
  Generator gen(seed);
  const Tensor x = random_tensor(s, dtype, gen);
  const std::vector<double> xv = values(x);
  std::vector<double> y;
  for (double v : xv) y.push_back(v > 0 ? v : 0.0);
  const Tensor out = kernels::relu_forward(non_contig ? non_contiguous(x) : x);
  ASSERT_EQ(out.shape(), s);
  EXPECT_TRUE(all_close(out, y, Tol{0, 0}));

  const Tensor gy = random_tensor(s, dtype, gen);
  const std::vector<double> gyv = values(gy);
  std::vector<double> gx;
  for (size_t i = 0; i < xv.size(); ++i) gx.push_back(xv[i] > 0 ? gyv[i] : 0.0);
  EXPECT_TRUE(all_close(kernels::relu_backward(non_contig ? non_contiguous(gy) : gy, out), gx, Tol{0, 0}));
}

}  // namespace

TEST(Relu, MatchesDefinition) {
  check({3, 4, 5}, kFloat32, false, 1);
  check({3, 4, 5}, kFloat64, false, 2);
  check({7, 6}, kFloat32, true, 3);
}

TEST(Relu, LargeOnSeveralThreads) {
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    check({8, 32, 26, 26}, kFloat32, false, 4);
  }
}

TEST(Relu, RejectsBadArguments) {
  EXPECT_TRUE(throws_with([&] { kernels::relu_forward(Tensor::zeros({3}, kInt64)); }, {"float32"}));
  EXPECT_TRUE(throws_with([&] { kernels::relu_backward(Tensor::zeros({3}), Tensor::zeros({4})); },
                          {"does not match"}));
}
