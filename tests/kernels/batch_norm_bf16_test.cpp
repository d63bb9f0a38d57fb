// The CPU batch-norm kernels on a bfloat16 input (kernels/batch_norm.h, kernels/batch_norm_pool.h):
// batch_norm, batch_norm_relu and the fused batch_norm + relu + 2x2 max-pool read x in bf16 and give
// float32 outputs, saved statistics, running statistics and weight/bias gradients, and a bf16 input
// gradient, each bitwise equal to the composition they replace: x cast up to float32, the float32
// kernel, the input gradient cast down (round to nearest even, NaN kept NaN). Training and eval, with
// and without affine parameters, planes whose size is not a multiple of the vector width (ragged
// ends), a NaN in x, on 1 and 2 threads. Mixed dtypes that the kernels do not take are rejected.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/amp.h"
#include "kernels/batch_norm.h"
#include "kernels/batch_norm_pool.h"

using namespace tandem;
using namespace tandem::test;

namespace {

bool is_nan_bits(const Tensor& t, int64_t i) {
  if (t.dtype() == kBFloat16) return (static_cast<const uint16_t*>(t.raw_data())[i] & 0x7fffu) > 0x7f80u;
  if (t.dtype() == kFloat32) return std::isnan(static_cast<const float*>(t.raw_data())[i]);
  return false;
}

// Bitwise equal, except that a NaN matches any NaN: which NaN (sign, payload) an instruction returns
// when several operands are NaN depends on the operand order the compiler chose (x86 returns the
// first), so the float32 kernels do not fix it either.
::testing::AssertionResult same_bits_or_nan(const Tensor& got, const Tensor& ref) {
  if (got.defined() != ref.defined()) return ::testing::AssertionFailure() << "defined differs";
  if (!got.defined()) return ::testing::AssertionSuccess();
  if (got.shape() != ref.shape() || got.dtype() != ref.dtype()) {
    return ::testing::AssertionFailure() << got.str() << " vs " << ref.str();
  }
  if (got.numel() == 0) return ::testing::AssertionSuccess();
  const int64_t size = static_cast<int64_t>(got.nbytes()) / got.numel();
  const auto* g = static_cast<const unsigned char*>(got.raw_data());
  const auto* r = static_cast<const unsigned char*>(ref.raw_data());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(g + i * size, r + i * size, size) == 0) continue;
    if (is_nan_bits(got, i) && is_nan_bits(ref, i)) continue;
    return ::testing::AssertionFailure() << "bits differ at element " << i << " of " << got.str();
  }
  return ::testing::AssertionSuccess();
}

Tensor up(const Tensor& t) { return kernels::cast(t, kFloat32); }
Tensor down(const Tensor& t) { return t.defined() ? kernels::cast(t, kBFloat16) : t; }

// One case: x in bf16 with an optional NaN, the float32 operands, and the gradient coming back.
struct Case {
  Tensor x, w, b, rm, rv;

  Case(const Shape& shape, bool affine, bool nan, uint64_t seed) {
    Generator gen(seed);
    const int64_t C = shape[1];
    Tensor xf = random_tensor(shape, kFloat32, gen, -2.0, 2.0);
    if (nan) xf.data<float>()[shape_numel(shape) / 2 + 1] = std::numeric_limits<float>::quiet_NaN();
    x = kernels::cast(xf, kBFloat16);
    w = affine ? random_tensor({C}, kFloat32, gen, 0.5, 1.5) : Tensor();
    b = affine ? random_tensor({C}, kFloat32, gen, -0.5, 0.5) : Tensor();
    rm = random_tensor({C}, kFloat32, gen, -0.2, 0.2);
    rv = random_tensor({C}, kFloat32, gen, 0.5, 2.0);
  }
};

enum class Op { plain, relu, pool };

kernels::BatchNormForward forward(Op op, const Tensor& x, const Case& k, Tensor& rm, Tensor& rv, bool training) {
  return op == Op::plain ? kernels::batch_norm_forward(x, k.w, k.b, rm, rv, training, 0.1, 1e-5)
                         : kernels::batch_norm_relu_forward(x, k.w, k.b, rm, rv, training, 0.1, 1e-5);
}

kernels::BatchNormGrads backward(Op op, const Tensor& gy, const Tensor& x, const Case& k, const Tensor& mean,
                                 const Tensor& invstd, bool training) {
  const bool affine = k.w.defined();
  return op == Op::plain
             ? kernels::batch_norm_backward(gy, x, k.w, mean, invstd, training, true, affine, affine)
             : kernels::batch_norm_relu_backward(gy, x, k.w, k.b, mean, invstd, training, true, affine, affine);
}

// Every result of the bf16 call against the cast-up composition, at 1 and 2 threads.
void check(Op op, const Shape& shape, bool training, bool affine, bool nan, uint64_t seed) {
  SCOPED_TRACE(shape_str(shape) + (op == Op::plain ? " plain" : op == Op::relu ? " relu" : " pool") +
               (training ? " train" : " eval") + (affine ? " affine" : "") + (nan ? " nan" : ""));
  const Case k(shape, affine, nan, seed);
  const Tensor xf = up(k.x);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    ThreadCountGuard guard(threads);
    Tensor rm_a = k.rm.clone(), rv_a = k.rv.clone(), rm_b = k.rm.clone(), rv_b = k.rv.clone();
    if (op == Op::pool) {
      const auto ref = kernels::batch_norm_relu_max_pool2d_forward(xf, k.w, k.b, rm_a, rv_a, training, 0.1, 1e-5);
      const auto got = kernels::batch_norm_relu_max_pool2d_forward(k.x, k.w, k.b, rm_b, rv_b, training, 0.1, 1e-5);
      EXPECT_TRUE(same_bits_or_nan(got.output, ref.output)) << "output";
      EXPECT_TRUE(same_bits_or_nan(got.code, ref.code)) << "code";
      EXPECT_TRUE(same_bits_or_nan(got.winner, ref.winner)) << "winner";
      EXPECT_TRUE(same_bits_or_nan(got.save_mean, ref.save_mean) && same_bits_or_nan(got.save_invstd, ref.save_invstd));
      EXPECT_TRUE(same_bits_or_nan(rm_b, rm_a) && same_bits_or_nan(rv_b, rv_a)) << "running statistics";
      Generator gen(seed + 1000);
      const Tensor gy = random_tensor(ref.output.shape(), kFloat32, gen);
      const auto rg = kernels::batch_norm_relu_max_pool2d_backward(gy, xf, ref.code, ref.winner, k.w, k.b, ref.save_mean,
                                                                   ref.save_invstd, training, true, affine, affine);
      const auto gg = kernels::batch_norm_relu_max_pool2d_backward(gy, k.x, got.code, got.winner, k.w, k.b,
                                                                   got.save_mean, got.save_invstd, training, true,
                                                                   affine, affine);
      EXPECT_EQ(gg.input.dtype(), kBFloat16);
      EXPECT_TRUE(same_bits_or_nan(gg.input, down(rg.input))) << "input grad";
      EXPECT_TRUE(same_bits_or_nan(gg.weight, rg.weight) && same_bits_or_nan(gg.bias, rg.bias)) << "weight/bias grads";
      continue;
    }
    const auto ref = forward(op, xf, k, rm_a, rv_a, training);
    const auto got = forward(op, k.x, k, rm_b, rv_b, training);
    EXPECT_EQ(got.output.dtype(), kFloat32);
    EXPECT_TRUE(same_bits_or_nan(got.output, ref.output)) << "output";
    EXPECT_TRUE(same_bits_or_nan(got.save_mean, ref.save_mean) && same_bits_or_nan(got.save_invstd, ref.save_invstd));
    EXPECT_TRUE(same_bits_or_nan(rm_b, rm_a) && same_bits_or_nan(rv_b, rv_a)) << "running statistics";
    Generator gen(seed + 1000);
    const Tensor gy = random_tensor(shape, kFloat32, gen);
    const auto rg = backward(op, gy, xf, k, ref.save_mean, ref.save_invstd, training);
    const auto gg = backward(op, gy, k.x, k, got.save_mean, got.save_invstd, training);
    EXPECT_EQ(gg.input.dtype(), kBFloat16);
    EXPECT_TRUE(same_bits_or_nan(gg.input, down(rg.input))) << "input grad";
    EXPECT_TRUE(same_bits_or_nan(gg.weight, rg.weight) && same_bits_or_nan(gg.bias, rg.bias)) << "weight/bias grads";
  }
}

void check_all(Op op) {
  uint64_t seed = 500;
  // Planes of 63, 143 (ragged vector ends), 676 (MnistNet's first; enough values per channel that two
  // threads take a channel each) and 20 values.
  for (const Shape& shape : {Shape{5, 3, 7, 9}, Shape{4, 5, 13, 11}, Shape{32, 3, 26, 26}, Shape{6, 4, 4, 5}})
    for (bool training : {true, false})
      for (bool affine : {true, false}) check(op, shape, training, affine, /*nan=*/false, ++seed);
  check(op, {3, 4, 9, 7}, true, true, /*nan=*/true, ++seed);
  check(op, {3, 4, 9, 7}, false, true, /*nan=*/true, ++seed);
}

}  // namespace

TEST(BatchNormBf16, PlainMatchesCastUpComposition) { check_all(Op::plain); }
TEST(BatchNormBf16, ReluMatchesCastUpComposition) { check_all(Op::relu); }
TEST(BatchNormBf16, ReluMaxPoolMatchesCastUpComposition) { check_all(Op::pool); }

TEST(BatchNormBf16, ThreeDimensionalInput) {
  // BatchNorm1d's [N, C, L]: the same rows with H*W = L.
  check(Op::plain, {7, 3, 19}, true, true, false, 900);
  check(Op::relu, {7, 3, 19}, false, true, false, 901);
}

TEST(BatchNormBf16, PoolEntryPointTakesTheFusedKernel) {
  const Case k({2, 3, 6, 7}, true, false, 950);
  Tensor rm = k.rm.clone(), rv = k.rv.clone();
  const auto f = kernels::batch_norm_relu_pool2d(k.x, k.w, k.b, rm, rv, true, 0.1, 1e-5);
  EXPECT_TRUE(f.code.defined() && !f.indices.defined());
  Tensor rm2 = k.rm.clone(), rv2 = k.rv.clone();
  const auto ref = kernels::batch_norm_relu_pool2d(up(k.x), k.w, k.b, rm2, rv2, true, 0.1, 1e-5);
  EXPECT_TRUE(same_bits_or_nan(f.output, ref.output));
  const Tensor gy = Tensor::ones(f.output.shape());
  const auto g = kernels::batch_norm_relu_pool2d_backward(gy, k.x, f, k.w, k.b, true, true, true, true);
  const auto rg = kernels::batch_norm_relu_pool2d_backward(gy, up(k.x), ref, k.w, k.b, true, true, true, true);
  EXPECT_TRUE(same_bits_or_nan(g.input, down(rg.input)));
}

TEST(BatchNormBf16, RejectsOtherOperandsNotFloat32) {
  const Case k({2, 3, 4, 4}, true, false, 960);
  const Tensor w16 = kernels::cast(k.w, kBFloat16);
  EXPECT_TRUE(throws_with([&] { kernels::batch_norm_forward(k.x, w16, k.b, Tensor(), Tensor(), true, 0.1, 1e-5); },
                          {"batch_norm_forward", "bfloat16 input", "float32", "bfloat16[3]"}));
  const auto f = kernels::batch_norm_forward(k.x, k.w, k.b, Tensor(), Tensor(), true, 0.1, 1e-5);
  const Tensor gy16 = kernels::cast(f.output, kBFloat16);
  EXPECT_TRUE(throws_with(
      [&] { kernels::batch_norm_backward(gy16, k.x, k.w, f.save_mean, f.save_invstd, true, true, true, true); },
      {"batch_norm_backward", "bfloat16 input", "float32"}));
  // float16 keeps its old rule: the kernels take float32 and float64 only.
  const Tensor x16 = kernels::cast(up(k.x), kFloat16);
  EXPECT_THROW(kernels::batch_norm_forward(x16, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5), Error);
}
