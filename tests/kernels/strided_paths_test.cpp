// The fast paths the training step of the example models relies on, against plain loops:
//   - Tensor::copy_ between strided layouts of one dtype (raw elements, the innermost dimension a
//     tight loop): contiguous() of permuted views and copies into permuted destinations, for
//     every element size (1, 2, 4, 8 bytes);
//   - kernels::bmm reading operands whose matrices are transposes of row-major ones in place
//     (the matmul backward's permuted views), every combination, and the copy it falls back to
//     for other layouts; the in-place reads give the bits of the contiguous operands;
//   - float32 GELU (erf form) forward and backward, on Eigen's vectorised erf and exp, against
//     the double formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/view.h"
#include "kernels/index.h"
#include "kernels/pointwise.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem;
using tandem::test::all_close;
using tandem::test::non_contiguous;
using tandem::test::random_tensor;
using tandem::test::tol_for;
using tandem::test::values;

namespace {

// v[i] = i % 200 (exact in every dtype, uint8 and float16 included), shape [2, 3, 4].
Tensor counting(DType dtype) {
  std::vector<double> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 37) % 200);
  return Tensor::from_vector<double>(v, {2, 3, 4}).to(dtype);
}

TEST(StridedCopy, ContiguousOfAPermutedViewIsTheGatherOfEveryDtype) {
  for (DType dtype : {kFloat32, kFloat64, kFloat16, kInt64, kInt32, kUInt8}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor src = counting(dtype);
    const std::vector<double> sv = values(src);
    const Tensor view = views::permute(src, {2, 0, 1});  // [4, 2, 3], view[k][i][j] = src[i][j][k]
    ASSERT_FALSE(view.is_contiguous());
    const Tensor out = view.contiguous();
    ASSERT_TRUE(out.is_contiguous());
    EXPECT_EQ(out.dtype(), dtype);
    std::vector<double> ref;
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) ref.push_back(sv[(i * 3 + j) * 4 + k]);
    EXPECT_TRUE(all_close(out, ref, {0, 0}));
  }
}

TEST(StridedCopy, CopyIntoAPermutedDestinationScattersEveryElement) {
  for (DType dtype : {kFloat32, kFloat64, kInt64, kUInt8}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor storage = Tensor::zeros({2, 3, 4}, dtype);
    Tensor dst = views::permute(storage, {1, 2, 0});  // [3, 4, 2], dst[j][k][i] = storage[i][j][k]
    const Tensor src = views::permute(counting(dtype), {1, 2, 0});  // strided source too
    dst.copy_(src);
    EXPECT_TRUE(all_close(storage, values(counting(dtype)), {0, 0}));
    // A narrowed (offset) destination: only its elements change.
    Tensor part = views::narrow(views::permute(storage, {2, 1, 0}), 0, 1, 2);  // [2, 3, 2] from k = 1
    part.copy_(Tensor::zeros(part.shape(), dtype));
    std::vector<double> ref = values(counting(dtype));
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 1; k < 3; ++k) ref[(i * 3 + j) * 4 + k] = 0;
    EXPECT_TRUE(all_close(storage, ref, {0, 0}));
  }
}

TEST(StridedPaths, BmmReadsTransposedOperandsInPlaceWithTheContiguousBits) {
  for (DType dtype : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(11);
    const int64_t B = 3, M = 37, K = 19, N = 23;
    const Tensor a = random_tensor({B, M, K}, dtype, gen), b = random_tensor({B, K, N}, dtype, gen);
    const auto av = values(a), bv = values(b);
    std::vector<double> ref(B * M * N, 0.0);
    for (int64_t n = 0; n < B; ++n)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          for (int64_t k = 0; k < K; ++k) ref[(n * M + i) * N + j] += av[(n * M + i) * K + k] * bv[(n * K + k) * N + j];
    const Tensor plain = kernels::bmm(a, b);
    ASSERT_TRUE(all_close(plain, ref, tol_for(dtype)));
    const Tensor at = non_contiguous(a), bt = non_contiguous(b);  // matrices stored transposed
    // A batch dimension that is not outermost in memory: not a transposed layout, copied.
    const Tensor a_batch_inner = views::permute(views::permute(a, {1, 0, 2}).contiguous(), {1, 0, 2});
    ASSERT_FALSE(a_batch_inner.is_contiguous());
    const std::vector<std::pair<Tensor, Tensor>> cases = {{at, b}, {a, bt}, {at, bt}, {a_batch_inner, bt}};
    for (size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE(c);
      const Tensor y = kernels::bmm(cases[c].first, cases[c].second);
      ASSERT_EQ(y.shape(), plain.shape());
      EXPECT_TRUE(all_close(y, ref, tol_for(dtype)));
      EXPECT_EQ(std::memcmp(y.raw_data(), plain.raw_data(), plain.nbytes()), 0) << "bits differ from contiguous";
    }
  }
}

TEST(StridedPaths, FloatGeluAndItsGradientMatchTheDoubleFormula) {
  std::vector<double> xs;
  for (double x = -12.0; x <= 12.0; x += 0.0137) xs.push_back(x);
  xs.insert(xs.end(), {0.0, -0.0, 1e-30, -1e-30, 40.0, -40.0});
  const int64_t n = static_cast<int64_t>(xs.size());  // not a multiple of 16: a ragged tail
  const Tensor x = Tensor::from_vector<double>(xs, {n}).to(kFloat32);
  Generator gen(5);
  const Tensor g = random_tensor({n}, kFloat32, gen, -2.0, 2.0);
  const auto xv = values(x), gv = values(g);
  std::vector<double> y_ref(n), gx_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    const double t = xv[i], cdf = 0.5 * (1.0 + std::erf(t / std::sqrt(2.0)));
    y_ref[i] = t * cdf;
    gx_ref[i] = gv[i] * (cdf + t * std::exp(-0.5 * t * t) / std::sqrt(2.0 * M_PI));
  }
  const Tensor y = kernels::unary(kernels::UnaryOp::Gelu, x);
  EXPECT_TRUE(all_close(y, y_ref, {1e-6, 1e-6}));
  EXPECT_TRUE(all_close(kernels::unary_backward(kernels::UnaryOp::Gelu, g, x, y), gx_ref, {1e-6, 1e-6}));
}

}  // namespace
