// max_pool2d forward/backward against a naive scan in double: the 2x2/2
// fast path, stride != kernel with padding, non-square sizes and odd
// (floor-mode) edges, ties going to the first maximum, overlapping windows
// accumulating in backward, int64 flat indices, and argument errors.
#include "kernels/pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.h"

using namespace tandem;
using namespace tandem::test;
using tandem::kernels::MaxPool2dArgs;

namespace {

struct RefPool {
  std::vector<double> out;
  std::vector<int64_t> idx;
  int64_t P, Q;
};

RefPool ref_forward(const std::vector<double>& x, int64_t N, int64_t C, int64_t H, int64_t W,
                    const MaxPool2dArgs& a) {
  RefPool r;
  r.P = (H + 2 * a.pad_h - a.kernel_h) / a.stride_h + 1;
  r.Q = (W + 2 * a.pad_w - a.kernel_w) / a.stride_w + 1;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < r.P; ++p)
        for (int64_t q = 0; q < r.Q; ++q) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t bi = -1;
          for (int64_t i = 0; i < a.kernel_h; ++i)
            for (int64_t j = 0; j < a.kernel_w; ++j) {
              const int64_t h = p * a.stride_h - a.pad_h + i, w = q * a.stride_w - a.pad_w + j;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;  // padding never wins
              const double v = x[((n * C + c) * H + h) * W + w];
              if (bi < 0 || v > best) {  // strictly greater: ties keep the first
                best = v;
                bi = h * W + w;
              }
            }
          r.out.push_back(best);
          r.idx.push_back(bi);
        }
  return r;
}

std::vector<double> ref_backward(const std::vector<double>& gy, const std::vector<int64_t>& idx, int64_t N,
                                 int64_t C, int64_t HW, int64_t PQ) {
  std::vector<double> gx(N * C * HW, 0.0);
  for (int64_t pl = 0; pl < N * C; ++pl)
    for (int64_t i = 0; i < PQ; ++i) gx[pl * HW + idx[pl * PQ + i]] += gy[pl * PQ + i];
  return gx;
}

void check(const Shape& s, const MaxPool2dArgs& a, DType dtype, bool ties, bool non_contig, uint64_t seed) {
  Generator gen(seed);
  Tensor x = random_tensor(s, dtype, gen, -3, 3);
  if (ties) {
    // Small integers: many equal values inside each window.
    std::vector<double> v = values(x);
    for (double& e : v) e = std::floor(e / 2.0);
    x = Tensor::from_vector<double>(v, s).to(dtype);
  }
  const std::vector<double> xv = values(x);
  const RefPool ref = ref_forward(xv, s[0], s[1], s[2], s[3], a);
  const auto r = kernels::max_pool2d_forward(non_contig ? non_contiguous(x) : x, a);
  ASSERT_EQ(r.output.shape(), (Shape{s[0], s[1], ref.P, ref.Q}));
  ASSERT_EQ(r.indices.dtype(), kInt64);
  EXPECT_TRUE(all_close(r.output, ref.out, Tol{0, 0}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), ref.idx);

  const Tensor gy = random_tensor(r.output.shape(), dtype, gen);
  const Tensor gx = kernels::max_pool2d_backward(non_contig ? non_contiguous(gy) : gy, r.indices, s);
  ASSERT_EQ(gx.shape(), s);
  EXPECT_TRUE(all_close(gx, ref_backward(values(gy), ref.idx, s[0], s[1], s[2] * s[3], ref.P * ref.Q),
                        tol_for(dtype)));
}

}  // namespace

TEST(MaxPool2d, TwoByTwoStrideTwo) {
  check({2, 3, 8, 6}, {2, 2, 2, 2, 0, 0}, kFloat32, false, false, 1);
  check({2, 3, 7, 9}, {2, 2, 2, 2, 0, 0}, kFloat64, false, false, 2);  // odd sizes: floor mode
  check({2, 3, 7, 9}, {2, 2, 2, 2, 0, 0}, kFloat32, true, false, 3);   // ties
}

TEST(MaxPool2d, StrideDiffersFromKernelWithPadding) {
  check({2, 2, 9, 7}, {3, 3, 2, 2, 1, 1}, kFloat64, false, false, 4);  // overlapping windows
  check({2, 2, 9, 7}, {3, 3, 2, 2, 1, 1}, kFloat32, true, false, 5);
  check({1, 3, 10, 11}, {3, 2, 1, 3, 1, 1}, kFloat64, false, false, 6);  // non-square kernel/stride
  check({2, 2, 6, 8}, {2, 4, 3, 1, 0, 2}, kFloat32, false, false, 7);
}

TEST(MaxPool2d, NonContiguousInput) { check({2, 3, 6, 5}, {2, 2, 2, 2, 0, 0}, kFloat64, false, true, 8); }

TEST(MaxPool2d, SeveralThreads) {
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    check({8, 16, 26, 26}, {2, 2, 2, 2, 0, 0}, kFloat32, false, false, 9);
    check({8, 16, 25, 26}, {3, 3, 2, 2, 1, 1}, kFloat32, false, false, 10);
  }
}

TEST(MaxPool2d, IndicesAreFlatWithinThePlane) {
  // One 4x4 plane; maxima at known places.
  const Tensor x = Tensor::from_vector<float>({0, 1, 2, 3,  //
                                               4, 9, 6, 7,  //
                                               8, 5, 1, 2,  //
                                               3, 4, 5, 8},
                                              {1, 1, 4, 4});
  const auto r = kernels::max_pool2d_forward(x, {2, 2, 2, 2, 0, 0});
  EXPECT_EQ(r.output.to_vector<float>(), (std::vector<float>{9, 7, 8, 8}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{5, 7, 8, 15}));
}

TEST(MaxPool2d, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({1, 1, 4, 4});
  EXPECT_TRUE(throws_with([&] { kernels::max_pool2d_forward(x, {2, 2, 2, 2, 2, 0}); }, {"half the kernel"}));
  EXPECT_TRUE(throws_with([&] { kernels::max_pool2d_forward(x, {2, 2, 0, 2, 0, 0}); }, {"stride"}));
  EXPECT_TRUE(throws_with([&] { kernels::max_pool2d_forward(x, {5, 5, 1, 1, 0, 0}); }, {"smaller"}));
  EXPECT_TRUE(throws_with([&] { kernels::max_pool2d_forward(Tensor::zeros({4, 4}), {}); }, {"[N, C, H, W]"}));
  const auto r = kernels::max_pool2d_forward(x, {});
  EXPECT_TRUE(throws_with([&] { kernels::max_pool2d_backward(r.output, r.indices.to(kInt32), x.shape()); },
                          {"int64"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::max_pool2d_backward(r.output, r.indices, {2, 1, 4, 4});
      },
      {"does not match"}));
}

TEST(MaxPool2d, NanWinsAsInPyTorch) {
  // Expected values and indices printed by PyTorch 1.13 (F.max_pool2d with
  // return_indices): a NaN replaces the running maximum, so the last NaN of
  // a window in scan order wins.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v{1, nan, 3, 0, nan, 2, 5, nan, 0, 0, -1, -2, 7, 0, -3, nan};
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor x = Tensor::from_vector<double>(v, {1, 1, 4, 4}).to(dtype);
    const auto r = kernels::max_pool2d_forward(x, {2, 2, 2, 2, 0, 0});
    EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{4, 7, 12, 15}));
    const std::vector<double> y = values(r.output);
    EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]) && y[2] == 7 && std::isnan(y[3]));
    const auto r3 = kernels::max_pool2d_forward(x, {3, 3, 1, 1, 1, 1});
    EXPECT_EQ(r3.indices.to_vector<int64_t>(),
              (std::vector<int64_t>{4, 4, 7, 7, 4, 4, 7, 7, 4, 4, 15, 15, 12, 12, 15, 15}));
  }
}
