// The general op set's CUDA kernels against its CPU kernels (the reference), through the
// device-neutral entry points of kernels/{pointwise,reduce,index,avg_pool,layer_norm}.h: the same
// random inputs on both devices, forward and backward, including broadcast operands, strided
// (transposed) views, reductions over middle dimensions, size-1 and empty dimensions, ties and
// NaN for max. Uses only device-neutral names, so it also compiles in a build without CUDA (where
// every test skips, or fails under TANDEM_REQUIRE_GPU=1).
//
// Tolerance: float32 results within 1e-5 relative (plus 1e-6 absolute for values near 0) of the
// CPU's. The two devices do the same float32 operations but not bitwise the same: CUDA's expf,
// erff, tanhf, powf... are within 1-2 ulp (6e-8 each) of glibc's, nvcc contracts a * b + c into
// fused multiply-adds, and sums run in another order (in double, then rounded once). Each of these
// is a few float32 ulps after the handful of operations an op chains, far below 1e-5, while a
// wrong index, broadcast or formula is off by far more. Exact ops (compare, where, max values and
// indices, index_select, gather, cat) must match bitwise. Sums of n signed terms get 1e-7 * n
// absolute on top (near_sum): the CPU adds up to 1024 terms in float (Eigen) before its double
// accumulation, an error that grows with n and with the terms' size, not with the result's, so a
// sum that cancels to near 0 is compared on that scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/view.h"
#include "gpu_test_util.h"
#include "kernels/avg_pool.h"
#include "kernels/index.h"
#include "kernels/layer_norm.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"
#include "kernels/scan.h"

namespace {

using namespace tandem;
using namespace tandem::gpu_test;
namespace K = tandem::kernels;

constexpr double kRtol = 1e-5, kAtol = 1e-6;

::testing::AssertionResult near(const Tensor& got, const Tensor& ref) {
  if (got.defined() && !got.device().is_cuda())
    return ::testing::AssertionFailure() << "result on " << got.device().str() << ", expected the GPU";
  return close(got, ref, kAtol, kRtol);
}

::testing::AssertionResult near_sum(const Tensor& got, const Tensor& ref, int64_t n) {
  if (got.defined() && !got.device().is_cuda())
    return ::testing::AssertionFailure() << "result on " << got.device().str() << ", expected the GPU";
  return close(got, ref, kAtol + 1e-7 * static_cast<double>(n), kRtol);
}

// t's values on the GPU in a non-contiguous layout: stored transposed (first and last dimension
// swapped), viewed back. A 0-D or 1-D t is uploaded as it is.
Tensor strided_gpu(const Tensor& t) {
  if (t.dim() < 2) return t.to(gpu());
  const int64_t last = t.dim() - 1;
  const Tensor dev = t.transpose(0, last).contiguous().to(gpu()).transpose(0, last);
  EXPECT_FALSE(dev.is_contiguous() && t.size(0) > 1 && t.size(last) > 1);
  return dev;
}

struct BinaryCase {
  Shape a, b;
  bool strided;
};

// Operand ranges where every op and its gradient are defined (pow: a > 0; div: |b| >= 0.5).
Tensor operand(K::BinaryOp op, int which, const Shape& shape, Generator& gen) {
  if (op == K::BinaryOp::Pow && which == 0) return random_cpu(shape, gen, 0.2, 2.0);
  if (op == K::BinaryOp::Div && which == 1) return random_cpu(shape, gen, 0.5, 2.0);
  if (op == K::BinaryOp::Maximum || op == K::BinaryOp::Minimum) return random_ties_cpu(shape, gen, 3);
  return random_cpu(shape, gen);
}

TEST(CudaGeneralOps, BroadcastBinaryOpsAndTheirGradientsMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(11);
  const std::vector<BinaryCase> cases = {{{5, 7}, {5, 7}, false},      {{4, 1, 6}, {5, 1}, false},
                                         {{3, 8}, {8}, true},          {{2, 3, 4}, {}, false},
                                         {{0, 3}, {3}, false},         {{1, 9}, {6, 1}, true}};
  for (int o = 0; o <= static_cast<int>(K::BinaryOp::Minimum); ++o) {
    const auto op = static_cast<K::BinaryOp>(o);
    for (const BinaryCase& c : cases) {
      SCOPED_TRACE(std::string(K::op_name(op)) + " " + shape_str(c.a) + " " + shape_str(c.b));
      const Tensor a = operand(op, 0, c.a, gen), b = operand(op, 1, c.b, gen);
      const Tensor ad = c.strided ? strided_gpu(a) : a.to(gpu()), bd = b.to(gpu());
      const Tensor y = K::binary(op, a, b), yd = K::binary(op, ad, bd);
      EXPECT_TRUE(near(yd, y));
      const Tensor g = random_cpu(y.shape(), gen);
      for (int which = 0; which < 2; ++which) {
        const Tensor gd = K::binary_backward(op, which, strided_gpu(g), ad, bd, yd);
        EXPECT_TRUE(near(gd, K::binary_backward(op, which, g, a, b, y))) << "which " << which;
        // ... and summed back to the operand's shape, as autograd does.
        const Shape& s = which == 0 ? c.a : c.b;
        EXPECT_TRUE(near_sum(K::sum_to(gd, s), K::sum_to(K::binary_backward(op, which, g, a, b, y), s),
                             y.numel() / std::max<int64_t>(shape_numel(s), 1)));
      }
    }
  }
}

TEST(CudaGeneralOps, ComparisonsAndWhereMatchCpuExactly) {
  TANDEM_NEED_GPUS(1);
  Generator gen(12);
  const Tensor a = random_ties_cpu({4, 1, 6}, gen, 3), b = random_ties_cpu({5, 1}, gen, 3);
  const Tensor ad = strided_gpu(a), bd = b.to(gpu());
  for (int o = 0; o <= static_cast<int>(K::CompareOp::Ge); ++o) {
    const auto op = static_cast<K::CompareOp>(o);
    const Tensor m = K::compare(op, ad, bd);
    EXPECT_EQ(m.dtype(), kUInt8);
    EXPECT_TRUE(same(m, K::compare(op, a, b))) << K::op_name(op);
  }
  const Tensor cond = K::compare(K::CompareOp::Gt, a, b);  // [4, 5, 6]
  const Tensor x = random_cpu({5, 6}, gen), y = random_cpu({}, gen);
  EXPECT_TRUE(same(K::where(cond.to(gpu()), strided_gpu(x), y.to(gpu())), K::where(cond, x, y)));
  const Tensor narrow_cond = K::compare(K::CompareOp::Lt, random_cpu({4, 1, 1}, gen), Tensor::zeros({}));
  EXPECT_TRUE(same(K::where(narrow_cond.to(gpu()), x.to(gpu()), strided_gpu(x.transpose(0, 1).contiguous().transpose(0, 1))),
                   K::where(narrow_cond, x, x)));
}

TEST(CudaGeneralOps, UnaryOpsAndTheirGradientsMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(13);
  for (int o = 0; o <= static_cast<int>(K::UnaryOp::Abs); ++o) {
    const auto op = static_cast<K::UnaryOp>(o);
    const bool positive = op == K::UnaryOp::Log || op == K::UnaryOp::Sqrt || op == K::UnaryOp::Rsqrt;
    for (const Shape& shape : {Shape{37, 29}, Shape{1}, Shape{0, 4}, Shape{}}) {
      SCOPED_TRACE(std::string(K::op_name(op)) + " " + shape_str(shape));
      const Tensor x = positive ? random_cpu(shape, gen, 0.1, 4.0) : random_cpu(shape, gen, -4.0, 4.0);
      const Tensor xd = strided_gpu(x);
      const Tensor y = K::unary(op, x), yd = K::unary(op, xd);
      EXPECT_TRUE(near(yd, y));
      const Tensor g = random_cpu(shape, gen);
      EXPECT_TRUE(near(K::unary_backward(op, g.to(gpu()), xd, yd), K::unary_backward(op, g, x, y)));
    }
  }
  // relu keeps NaN, as the CPU kernel and PyTorch.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor v = Tensor::from_vector<float>({-1.0f, 0.0f, 2.0f, nan}, {4});
  EXPECT_TRUE(same(K::unary(K::UnaryOp::Relu, v.to(gpu())), K::unary(K::UnaryOp::Relu, v)));
}

TEST(CudaGeneralOps, DropoutMaskHasTheDistributionAndIsFixedBySeed) {
  TANDEM_NEED_GPUS(1);
  const double p = 0.3;
  const int64_t n = int64_t{1} << 20;
  Generator gen(14);
  const Tensor m = K::dropout_mask({n / 1024, 1024}, p, kFloat32, gpu(), gen);
  ASSERT_TRUE(m.device().is_cuda());
  const std::vector<float> v = m.to_vector<float>();
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  int64_t zeros = 0;
  for (float x : v) {
    ASSERT_TRUE(x == 0.0f || x == keep) << x;
    zeros += x == 0.0f;
  }
  // Bernoulli(p) over 2^20 elements: standard deviation 4.5e-4 in the fraction; 0.005 is 11 of them.
  EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(n), p, 0.005);
  // Neighbouring elements are independent: the fraction of zero pairs is p^2.
  int64_t pairs = 0;
  for (size_t i = 0; i + 1 < v.size(); i += 2) pairs += v[i] == 0.0f && v[i + 1] == 0.0f;
  EXPECT_NEAR(static_cast<double>(pairs) / static_cast<double>(n / 2), p * p, 0.005);
  // The seed fixes the mask; the generator advances, so the next mask differs.
  Generator again(14);
  EXPECT_TRUE(same(K::dropout_mask({n / 1024, 1024}, p, kFloat32, gpu(), again), m));
  EXPECT_FALSE(same(K::dropout_mask({n / 1024, 1024}, p, kFloat32, gpu(), again), m));
  for (float x : K::dropout_mask({1000}, 0.0, kFloat32, gpu(), gen).to_vector<float>()) EXPECT_EQ(x, 1.0f);
  EXPECT_TRUE(throws_with([&] { K::dropout_mask({4}, p, kFloat64, gpu(), gen); }, {"dropout", "float32"}));
}

TEST(CudaGeneralOps, SumsOverEveryDimensionSubsetMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(15);
  const Tensor x = random_cpu({3, 4, 5, 6}, gen);
  const Tensor xd = x.to(gpu()), xs = strided_gpu(x);
  for (int mask = 0; mask < 16; ++mask) {
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < 4; ++d)
      if (mask & (1 << d)) dims.push_back(d);
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dims mask " << mask << " keepdim " << keepdim);
      const Tensor ref = K::sum_dims(x, dims, keepdim);
      const int64_t n = x.numel() / std::max<int64_t>(ref.numel(), 1);
      EXPECT_TRUE(near_sum(K::sum_dims(xd, dims, keepdim), ref, n));
      EXPECT_TRUE(near_sum(K::sum_dims(xs, dims, keepdim), ref, n));
    }
  }
  // Long rows (block reduction) and long columns (serial walk), a size-1 and an empty dimension.
  const Tensor wide = random_cpu({3, 5000}, gen), tall = random_cpu({5000, 3}, gen);
  EXPECT_TRUE(near_sum(K::sum_dims(wide.to(gpu()), {1}, false), K::sum_dims(wide, {1}, false), 5000));
  EXPECT_TRUE(near_sum(K::sum_dims(tall.to(gpu()), {0}, false), K::sum_dims(tall, {0}, false), 5000));
  // Column tiles: inner wider than a tile and not a multiple of it, an outer index, rows not a multiple of the lanes.
  const Tensor slab = random_cpu({3, 203, 100}, gen);
  EXPECT_TRUE(near_sum(K::sum_dims(slab.to(gpu()), {1}, false), K::sum_dims(slab, {1}, false), 203));
  const Tensor one = random_cpu({4, 1, 3}, gen), empty = random_cpu({2, 0, 3}, gen);
  EXPECT_TRUE(near(K::sum_dims(one.to(gpu()), {1}, true), K::sum_dims(one, {1}, true)));
  EXPECT_TRUE(near(K::sum_dims(empty.to(gpu()), {1}, false), K::sum_dims(empty, {1}, false)));  // zeros
  const Tensor s0 = random_cpu({}, gen);
  EXPECT_TRUE(near(K::sum_dims(s0.to(gpu()), {}, false), K::sum_dims(s0, {}, false)));
  // sum_to: a broadcast gradient summed back to a bias shape.
  const Tensor g = random_cpu({2, 4, 5, 6}, gen);
  EXPECT_TRUE(near_sum(K::sum_to(g.to(gpu()), {4, 1, 6}), K::sum_to(g, {4, 1, 6}), 10));
  EXPECT_TRUE(near_sum(K::sum_to(strided_gpu(g), {6}), K::sum_to(g, {6}), 200));
}

TEST(CudaGeneralOps, MaxAndAmaxMatchCpuWithTiesAndNan) {
  TANDEM_NEED_GPUS(1);
  Generator gen(16);
  Tensor x = random_ties_cpu({3, 4, 5}, gen, 3);
  std::vector<float> v = x.to_vector<float>();
  v[7] = v[31] = std::numeric_limits<float>::quiet_NaN();
  x = Tensor::from_vector<float>(v, {3, 4, 5});
  for (const Tensor& xd : {x.to(gpu()), strided_gpu(x)}) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "dim " << dim << " keepdim " << keepdim);
        const K::MaxResult ref = K::max_dim(x, dim, keepdim), got = K::max_dim(xd, dim, keepdim);
        EXPECT_TRUE(same(got.values, ref.values));
        EXPECT_EQ(got.indices.to_vector<int64_t>(), ref.indices.to_vector<int64_t>());
        EXPECT_EQ(got.indices.shape(), ref.indices.shape());
        EXPECT_TRUE(same(K::amax(xd, {dim}, keepdim), K::amax(x, {dim}, keepdim)));
      }
    }
    EXPECT_TRUE(same(K::amax(xd, {0, 2}, false), K::amax(x, {0, 2}, false)));
    EXPECT_TRUE(same(K::amax(xd, {}, false), K::amax(x, {}, false)));
  }
  // A long row (block argmax) with its maximum repeated: the first one wins.
  Tensor row = random_cpu({2, 3000}, gen);
  std::vector<float> r = row.to_vector<float>();
  r[100] = r[2000] = r[3000 + 5] = r[3000 + 2999] = 7.0f;
  row = Tensor::from_vector<float>(r, {2, 3000});
  const K::MaxResult rm = K::max_dim(row.to(gpu()), 1, false);
  EXPECT_EQ(rm.indices.to_vector<int64_t>(), (std::vector<int64_t>{100, 5}));
  EXPECT_EQ(rm.indices.to_vector<int64_t>(), K::max_dim(row, 1, false).indices.to_vector<int64_t>());
  const Tensor s = random_cpu({1, 1}, gen);
  EXPECT_TRUE(same(K::max_dim(s.to(gpu()), 0, true).values, K::max_dim(s, 0, true).values));
}

// prod, its backward (zeros included) and cumsum (both directions) along every dimension, strided
// input included: the same double accumulation in the same order as the CPU, rounded once.
TEST(CudaGeneralOps, ProdAndCumsumAlongEveryDimensionMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(19);
  Tensor x = random_cpu({3, 4, 5}, gen, 0.5, 1.5);
  std::vector<float> v = x.to_vector<float>();
  v[6] = v[26] = v[47] = 0.0f;
  x = Tensor::from_vector<float>(v, {3, 4, 5});
  for (const Tensor& xd : {x.to(gpu()), strided_gpu(x)}) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim);
      EXPECT_TRUE(near(K::prod_dim(xd, dim, true), K::prod_dim(x, dim, true)));
      const Tensor g = random_cpu(K::prod_dim(x, dim, true).shape(), gen);
      EXPECT_TRUE(near(K::prod_dim_backward(g.to(gpu()), xd, dim), K::prod_dim_backward(g, x, dim)));
      for (bool reverse : {false, true}) EXPECT_TRUE(near(K::cumsum(xd, dim, reverse), K::cumsum(x, dim, reverse)));
    }
  }
  const Tensor e = Tensor::zeros({2, 0, 3});
  EXPECT_TRUE(same(K::prod_dim(e.to(gpu()), 1, false), K::prod_dim(e, 1, false)));  // ones
  EXPECT_EQ(K::cumsum(e.to(gpu()), 1).numel(), 0);
}

TEST(CudaGeneralOps, SoftmaxAndLogSoftmaxOverEveryDimensionMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(17);
  const Tensor x = random_cpu({3, 4, 5}, gen, -5.0, 5.0);
  for (bool log : {false, true}) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      SCOPED_TRACE(::testing::Message() << "log " << log << " dim " << dim);
      const Tensor y = K::softmax_forward(x, dim, log), yd = K::softmax_forward(strided_gpu(x), dim, log);
      EXPECT_TRUE(near(yd, y));
      const Tensor g = random_cpu(x.shape(), gen);
      EXPECT_TRUE(near(K::softmax_backward(strided_gpu(g), yd, dim, log), K::softmax_backward(g, y, dim, log)));
    }
    const Tensor wide = random_cpu({3, 5000}, gen, -10.0, 10.0);  // one block per row
    const Tensor y = K::softmax_forward(wide, -1, log), yd = K::softmax_forward(wide.to(gpu()), -1, log);
    EXPECT_TRUE(near(yd, y));
    const Tensor g = random_cpu(wide.shape(), gen);
    EXPECT_TRUE(near(K::softmax_backward(g.to(gpu()), yd, -1, log), K::softmax_backward(g, y, -1, log)));
    const Tensor one = random_cpu({4, 1}, gen);  // a size-1 softmax dimension: 1 (or 0 for log)
    EXPECT_TRUE(near(K::softmax_forward(one.to(gpu()), 1, log), K::softmax_forward(one, 1, log)));
  }
  // A row masked with -inf except one entry (causal attention's first row).
  const float ninf = -std::numeric_limits<float>::infinity();
  const Tensor masked = Tensor::from_vector<float>({0.5f, ninf, ninf, 1.0f, 2.0f, ninf}, {2, 3});
  EXPECT_TRUE(near(K::softmax_forward(masked.to(gpu()), 1, false), K::softmax_forward(masked, 1, false)));
}

TEST(CudaGeneralOps, IndexSelectGatherAndCatMatchCpuExactly) {
  TANDEM_NEED_GPUS(1);
  Generator gen(18);
  const Tensor x = random_cpu({4, 5, 6}, gen);
  const Tensor idx = Tensor::from_vector<int64_t>({3, 0, 0, 2}, {4});  // < every size of x
  for (int64_t dim = 0; dim < 3; ++dim) {
    EXPECT_TRUE(same(K::index_select(strided_gpu(x), dim, idx.to(gpu())), K::index_select(x, dim, idx))) << dim;
  }
  const Tensor idx32 = Tensor::from_vector<int32_t>({1, 3}, {2});
  EXPECT_TRUE(same(K::index_select(x.to(gpu()), 1, idx32.to(gpu())), K::index_select(x, 1, idx32)));
  const Tensor gidx = Tensor::from_vector<int64_t>({0, 4, 4, 1, 2, 3, 0, 0, 1, 1, 2, 2}, {2, 3, 2});
  EXPECT_TRUE(same(K::gather(strided_gpu(x), 1, gidx.to(gpu())), K::gather(x, 1, gidx)));
  const Tensor gidx2 = Tensor::from_vector<int64_t>({3, 0, 1, 2, 2, 1}, {1, 2, 3});
  EXPECT_TRUE(same(K::gather(x.to(gpu()), 0, gidx2.to(gpu())), K::gather(x, 0, gidx2)));
  EXPECT_TRUE(throws_with([&] { K::gather(x.to(gpu()), 1, Tensor::from_vector<int64_t>({5}, {1, 1, 1}).to(gpu())); },
                          {"gather", "index 5"}));
  const Tensor y = random_cpu({4, 2, 6}, gen), z = random_cpu({4, 1, 6}, gen);
  const Tensor c = K::cat({x, y, z}, 1);
  const Tensor cd = K::cat({strided_gpu(x), y.to(gpu()), z.to(gpu())}, 1);
  EXPECT_TRUE(cd.device().is_cuda());
  EXPECT_TRUE(same(cd, c));
  EXPECT_TRUE(same(K::cat({x.to(gpu()), x.to(gpu())}, -1), K::cat({x, x}, -1)));
}

TEST(CudaGeneralOps, IndexAddAndScatterAddMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(19);
  // Repeated indices (atomic accumulation into one slice) and a skipped padding index.
  const Tensor idx = Tensor::from_vector<int64_t>({2, 0, 2, 4, 2, 1}, {6});
  for (int64_t dim = 0; dim < 3; ++dim) {
    Shape shape{5, 5, 5};
    Shape src_shape = shape;
    src_shape[dim] = 6;
    const Tensor src = random_cpu(src_shape, gen);
    for (int64_t skip : {K::kNoSkip, int64_t{2}}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " skip " << skip);
      EXPECT_TRUE(near(K::index_add(shape, dim, idx.to(gpu()), strided_gpu(src), skip),
                       K::index_add(shape, dim, idx, src, skip)));
    }
  }
  // The embedding backward's shape: [tokens, dim] rows added into [vocab, dim].
  const Tensor tokens = Tensor::from_vector<int64_t>({3, 3, 0, 7, 3, 0, 9, 9}, {8});
  const Tensor rows = random_cpu({8, 64}, gen);
  EXPECT_TRUE(near(K::index_add({10, 64}, 0, tokens.to(gpu()), rows.to(gpu()), 0),
                   K::index_add({10, 64}, 0, tokens, rows, 0)));
  const Tensor sidx = Tensor::from_vector<int64_t>({0, 2, 2, 1, 0, 0, 1, 1, 2, 0, 2, 2}, {2, 3, 2});
  const Tensor ssrc = random_cpu({2, 3, 2}, gen);
  for (int64_t dim = 0; dim < 3; ++dim) {
    EXPECT_TRUE(near(K::scatter_add({3, 3, 3}, dim, sidx.to(gpu()), strided_gpu(ssrc)),
                     K::scatter_add({3, 3, 3}, dim, sidx, ssrc)))
        << dim;
  }
  EXPECT_TRUE(near(K::index_add({3, 4}, 0, Tensor::zeros({0}, kInt64).to(gpu()), Tensor::zeros({0, 4}).to(gpu())),
                   Tensor::zeros({3, 4})));
}

TEST(CudaGeneralOps, BmmMatchesCpuForRowMajorTransposedAndEmptyOperands) {
  TANDEM_NEED_GPUS(1);
  Generator gen(20);
  const Tensor a = random_cpu({3, 5, 7}, gen), b = random_cpu({3, 7, 4}, gen);
  const Tensor ref = K::bmm(a, b);
  const Tensor ad = a.to(gpu()), bd = b.to(gpu());
  // Transposed views read in place (attention's q k^T), and a fully strided copy.
  const Tensor at = a.transpose(1, 2).contiguous().to(gpu()).transpose(1, 2);
  const Tensor bt = b.transpose(1, 2).contiguous().to(gpu()).transpose(1, 2);
  EXPECT_TRUE(near(K::bmm(ad, bd), ref));
  EXPECT_TRUE(near(K::bmm(at, bd), ref));
  EXPECT_TRUE(near(K::bmm(ad, bt), ref));
  EXPECT_TRUE(near(K::bmm(at, bt), ref));
  EXPECT_TRUE(near(K::bmm(strided_gpu(a), strided_gpu(b)), ref));
  // A batch-broadcast operand (batch stride 0) and a sliced one (row stride > columns).
  const Tensor one = random_cpu({1, 7, 4}, gen);
  const Tensor expanded = views::expand(one.to(gpu()), {3, 7, 4});
  EXPECT_TRUE(near(K::bmm(ad, expanded), K::bmm(a, views::expand(one, {3, 7, 4}).contiguous())));
  const Tensor wide = random_cpu({3, 7, 9}, gen);
  EXPECT_TRUE(near(K::bmm(ad, wide.to(gpu()).slice(2, 2, 6)), K::bmm(a, wide.slice(2, 2, 6).contiguous())));
  // K = 0 gives zeros; an empty batch an empty result.
  const Tensor z = K::bmm(Tensor::zeros({2, 3, 0}).to(gpu()), Tensor::zeros({2, 0, 4}).to(gpu()));
  EXPECT_TRUE(same(z, Tensor::zeros({2, 3, 4})));
  EXPECT_EQ(K::bmm(Tensor::zeros({0, 3, 2}).to(gpu()), Tensor::zeros({0, 2, 4}).to(gpu())).shape(), Shape({0, 3, 4}));
}

TEST(CudaGeneralOps, AvgPoolForwardAndBackwardMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(21);
  const Tensor x = random_cpu({2, 3, 11, 9}, gen);
  std::vector<K::AvgPool2dArgs> all = {{2, 2, 2, 2, 0, 0, false, true}, {3, 3, 2, 2, 1, 1, false, true},
                                       {3, 3, 2, 2, 1, 1, true, true},  {3, 3, 2, 2, 1, 1, true, false},
                                       {3, 2, 1, 2, 1, 1, false, false}, {5, 4, 3, 3, 2, 2, true, true}};
  for (const K::AvgPool2dArgs& a : all) {
    SCOPED_TRACE(::testing::Message() << "kernel " << a.kernel_h << "x" << a.kernel_w << " stride " << a.stride_h << "x"
                                      << a.stride_w << " pad " << a.pad_h << "x" << a.pad_w << " ceil " << a.ceil_mode
                                      << " include_pad " << a.count_include_pad);
    const Tensor y = K::avg_pool2d_forward(x, a);
    EXPECT_TRUE(near(K::avg_pool2d_forward(strided_gpu(x), a), y));
    const Tensor g = random_cpu(y.shape(), gen);
    EXPECT_TRUE(near(K::avg_pool2d_backward(strided_gpu(g), x.shape(), a), K::avg_pool2d_backward(g, x.shape(), a)));
  }
  // Adaptive: shrinking with overlapping windows, global, and growing (windows repeat inputs).
  for (auto [oh, ow] : {std::pair<int64_t, int64_t>{4, 5}, {1, 1}, {13, 10}, {11, 9}}) {
    SCOPED_TRACE(::testing::Message() << "adaptive " << oh << "x" << ow);
    const Tensor y = K::adaptive_avg_pool2d_forward(x, oh, ow);
    EXPECT_TRUE(near(K::adaptive_avg_pool2d_forward(strided_gpu(x), oh, ow), y));
    const Tensor g = random_cpu(y.shape(), gen);
    EXPECT_TRUE(near(K::adaptive_avg_pool2d_backward(g.to(gpu()), x.shape()), K::adaptive_avg_pool2d_backward(g, x.shape())));
  }
}

TEST(CudaGeneralOps, LayerNormForwardAndBackwardMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(22);
  struct Case {
    Shape x;
    int64_t n;
    bool affine;
  };
  for (const Case& c : {Case{{4, 7, 33}, 33, true}, Case{{4, 7, 33}, 7 * 33, true}, Case{{5, 600}, 600, false},
                        Case{{1, 1}, 1, true}, Case{{3, 2, 1000}, 1000, true},
                        Case{{300, 70}, 70, true}, Case{{16, 64, 768}, 768, true}}) {  // column tiles, many rows
    SCOPED_TRACE(shape_str(c.x) + " over " + std::to_string(c.n));
    const Tensor x = random_cpu(c.x, gen, -3.0, 5.0);
    const Tensor w = c.affine ? random_cpu({c.n}, gen) : Tensor(), b = c.affine ? random_cpu({c.n}, gen) : Tensor();
    const Tensor wd = c.affine ? w.to(gpu()) : Tensor(), bd = c.affine ? b.to(gpu()) : Tensor();
    const K::LayerNormForward ref = K::layer_norm_forward(x, c.n, w, b, 1e-5);
    const Tensor xd = strided_gpu(x);
    const K::LayerNormForward got = K::layer_norm_forward(xd, c.n, wd, bd, 1e-5);
    EXPECT_TRUE(near(got.output, ref.output));
    EXPECT_TRUE(near(got.mean, ref.mean));
    EXPECT_TRUE(near(got.rstd, ref.rstd));
    const Tensor g = random_cpu(c.x, gen);
    const K::LayerNormGrads gr = K::layer_norm_backward(g, x, ref.mean, ref.rstd, w, true, c.affine, c.affine);
    const K::LayerNormGrads gg =
        K::layer_norm_backward(strided_gpu(g), xd, got.mean, got.rstd, wd, true, c.affine, c.affine);
    EXPECT_TRUE(near(gg.input, gr.input));
    if (c.affine) {
      EXPECT_TRUE(near(gg.weight, gr.weight));
      EXPECT_TRUE(near(gg.bias, gr.bias));
    }
  }
}

}  // namespace
