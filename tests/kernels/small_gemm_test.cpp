// Linear on the AVX-512 small-GEMM path (kernels/cpu/small_gemm.*: float32, batch <= 256, big
// enough products): forward, input and weight gradients against double references on shapes that
// hit every tail (batch not a multiple of 16 or 64, rows not a multiple of the 6-row tile, a
// reduction longer than the 512-deep k block, a short one whose weight is read in place), and results
// bitwise equal for 1, 2 and 3 threads.
// On a build without AVX-512 the same calls take the Eigen path and the value checks still apply.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/ops.h"
#include "kernel_test_util.h"
#include "kernels/cpu/small_gemm.h"
#include "kernels/linear.h"

using namespace tandem;
using namespace tandem::test;

namespace {

struct Ref {
  std::vector<double> y, gx, gw;
};

Ref reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
              const std::vector<double>& gy, int64_t N, int64_t I, int64_t O) {
  Ref r{std::vector<double>(N * O), std::vector<double>(N * I, 0.0), std::vector<double>(O * I, 0.0)};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < I; ++i) acc += x[n * I + i] * w[o * I + i];
      r.y[n * O + o] = acc;
      for (int64_t i = 0; i < I; ++i) {
        r.gx[n * I + i] += gy[n * O + o] * w[o * I + i];
        r.gw[o * I + i] += gy[n * O + o] * x[n * I + i];
      }
    }
  return r;
}

void check(int64_t N, int64_t I, int64_t O, uint64_t seed) {
  SCOPED_TRACE("N " + std::to_string(N) + " I " + std::to_string(I) + " O " + std::to_string(O));
  Generator gen(seed);
  const Tensor x = random_tensor({N, I}, kFloat32, gen), w = random_tensor({O, I}, kFloat32, gen);
  const Tensor b = random_tensor({O}, kFloat32, gen), gy = random_tensor({N, O}, kFloat32, gen);
  const Ref ref = reference(values(x), values(w), values(b), values(gy), N, I, O);
  const Tol tol = tol_for(kFloat32);
  Tensor y1, gx1, gw1;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadCountGuard guard(threads);
    const Tensor y = kernels::linear_forward(x, w, b);
    const auto g = kernels::linear_backward(gy, x, w, true, true, false);
    EXPECT_TRUE(all_close(y, ref.y, tol)) << "forward";
    EXPECT_TRUE(all_close(g.input, ref.gx, tol)) << "input grad";
    EXPECT_TRUE(all_close(g.weight, ref.gw, tol)) << "weight grad";
    if (threads == 1) {
      y1 = y, gx1 = g.input, gw1 = g.weight;
    } else if (tandem::kernels::cpu::detail::small_gemm_available()) {
      EXPECT_TRUE(same_bits(y, y1)) << "forward bits differ from 1 thread";
      EXPECT_TRUE(same_bits(g.input, gx1)) << "input grad bits differ from 1 thread";
      EXPECT_TRUE(same_bits(g.weight, gw1)) << "weight grad bits differ from 1 thread";
    }
  }
}

}  // namespace

TEST(SmallGemm, BatchTailsAndRowTails) { check(37, 700, 301, 21); }

TEST(SmallGemm, ReductionLongerThanOneKBlock) { check(64, 1030, 260, 22); }

TEST(SmallGemm, WideBatch) { check(130, 520, 257, 23); }

TEST(SmallGemm, ExactTiles) { check(64, 512, 384, 24); }

// A short reduction (O < 256): the input gradient reads the weight in place as B, split over input
// features whose count is not a multiple of the 64-column panel (the last panel's masked loads).
TEST(SmallGemm, ShortReductionReadsTheWeightInPlace) { check(45, 1000, 130, 25); }
