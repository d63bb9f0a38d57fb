// Mixed-precision kernels on CPU: the fast casts against hand-picked rounding cases and against the
// generic Tensor::to conversion (Eigen's round-to-nearest-even) bit for bit; the low-precision
// conv2d/linear against "f32 math on the rounded operands, rounded result" (bit for bit when emulated,
// within one bf16 step on the native bf16 path); the fused
// unscale + non-finite check; and dtype errors.
#include "kernels/amp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/view.h"
#include "kernel_test_util.h"
#include "kernels/cpu/bf16.h"

using namespace tandem;
using namespace tandem::test;

namespace {

// Where bf16 runs natively (kernels::cpu_bf16_pays(): oneDNN, f32 accumulation in its own order)
// the result may differ from "f32 math on the rounded operands, rounded" by the f32 sum's rounding
// carried through the final rounding: at most one bf16 step (2^-7 relative); the emulation (f16,
// or CPUs without bf16 instructions) must match it bit for bit.
::testing::AssertionResult same_or_one_step(const Tensor& got, const Tensor& ref) {
  const bool exact = !(got.dtype() == kBFloat16 && kernels::cpu_bf16_pays());
  const auto g = values(got), r = values(ref);
  if (g.size() != r.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < g.size(); ++i) {
    const bool ok = exact ? (g[i] == r[i] || (std::isnan(g[i]) && std::isnan(r[i])))
                          : std::abs(g[i] - r[i]) <= 0x1p-7 * std::abs(r[i]) + 1e-30;
    if (!ok) return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << r[i];
  }
  return ::testing::AssertionSuccess();
}

std::vector<uint16_t> bits16(const Tensor& t) {
  std::vector<uint16_t> out(t.numel());
  std::memcpy(out.data(), t.contiguous().raw_data(), out.size() * 2);
  return out;
}

Tensor f32(std::vector<float> v) { return Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size())}); }

}  // namespace

TEST(AmpCast, Bf16RoundsToNearestEvenAndKeepsSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1) wins; 1 + 3*2^-8 ties to 1 + 2^-6 (even);
  // 1 + 2^-8 + 2^-20 is above the tie: rounds up.
  const Tensor x = f32({1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f, inf, -inf,
                        std::numeric_limits<float>::quiet_NaN(), 3.0e38f});
  const Tensor y = kernels::cast(x, kBFloat16);
  ASSERT_EQ(y.dtype(), kBFloat16);
  const auto b = bits16(y);
  EXPECT_EQ(b[0], 0x3f80);
  EXPECT_EQ(b[1], 0x3f80);
  EXPECT_EQ(b[2], 0x3f82);
  EXPECT_EQ(b[3], 0x3f81);
  EXPECT_EQ(b[4], 0xc020);
  EXPECT_EQ(b[5], 0x7f80);
  EXPECT_EQ(b[6], 0xff80);
  EXPECT_TRUE((b[7] & 0x7f80) == 0x7f80 && (b[7] & 0x7f) != 0) << std::hex << b[7];  // still NaN
  EXPECT_EQ(b[8], 0x7f62);  // 3e38 rounds within range
  const auto back = kernels::cast(y, kFloat32).to_vector<float>();
  EXPECT_EQ(back[2], 1.0f + 0x1p-6f);
  EXPECT_EQ(back[4], -2.5f);
  EXPECT_TRUE(std::isnan(back[7]));
}

TEST(AmpCast, MatchesGenericConversionBitForBit) {
  Generator gen(7);
  const Tensor x = random_tensor({1000, 37}, kFloat32, gen, -1e4, 1e4);  // large: several pool chunks
  for (DType d : {kBFloat16, kFloat16}) {
    const Tensor fast = kernels::cast(x, d);
    const Tensor slow = x.to(d);
    EXPECT_EQ(bits16(fast), bits16(slow)) << dtype_name(d);
    const auto up_fast = kernels::cast(fast, kFloat32).to_vector<float>();
    const auto up_slow = slow.to(kFloat32).to_vector<float>();
    EXPECT_EQ(up_fast, up_slow) << dtype_name(d);
  }
  // f16 overflows to inf above 65504; bf16 does not.
  const Tensor big = f32({70000.0f, 65504.0f});
  EXPECT_TRUE(std::isinf(kernels::cast(big, kFloat16).to_vector<float>()[0]));
  EXPECT_EQ(kernels::cast(big, kFloat16).to_vector<float>()[1], 65504.0f);
  EXPECT_EQ(kernels::cast(big, kBFloat16).to_vector<float>()[0], 70144.0f);
  // Every class of float (random bit patterns: denormals, NaNs and infinities among them) in an odd count
  // above the pool's cast grain, cut over 1-3 threads: the vector lanes' conversion as the scalar one
  // (kernels/cpu/bf16.h; a NaN keeps its payload, quieted, where Tensor::to makes it the canonical NaN).
  std::vector<float> any(300001);
  uint64_t state = 0x2545F4914F6CDD1Dull;
  for (size_t i = 0; i < any.size(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = uint32_t(state >> 32);
    if (i % 7 == 3) u &= 0x807FFFFFu;  // a denormal (or zero)
    std::memcpy(&any[i], &u, 4);
  }
  std::vector<uint16_t> want(any.size());
  for (size_t i = 0; i < any.size(); ++i) want[i] = kernels::cpu::detail::f32_to_bf16_bits(any[i]);
  const Tensor mixed = Tensor::from_vector<float>(any, {int64_t(any.size())});
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    EXPECT_EQ(bits16(kernels::cast(mixed, kBFloat16)), want) << threads << " threads";
  }
  // Non-contiguous input and same-dtype pass-through.
  const Tensor nc = non_contiguous(random_tensor({4, 5}, kFloat32, gen));
  EXPECT_EQ(bits16(kernels::cast(nc, kBFloat16)), bits16(nc.contiguous().to(kBFloat16)));
  EXPECT_TRUE(kernels::cast(x, kFloat32).is_same(x));
}

TEST(AmpCast, StridedOperandsMatchTheGenericConversionAtAnyThreadCount) {
  // Attention heads ([N, L, H, D] permuted to [N, H, L, D]: rows of unit stride), a transpose (no
  // unit stride), a slice with an offset; large enough (> 2^18 elements) to be cut over the pool,
  // so chunks start mid-way through the outer dimensions.
  Generator gen(13);
  const Tensor heads = views::permute(random_tensor({8, 128, 16, 40}, kFloat32, gen, -1e3, 1e3), {0, 2, 1, 3});
  const Tensor trans = random_tensor({700, 600}, kFloat32, gen, -1e3, 1e3).transpose(0, 1);
  const Tensor sliced = random_tensor({9, 70, 30}, kFloat32, gen).slice(1, 3, 67).slice(2, 1, 29);
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    for (const Tensor& x : {heads, trans, sliced}) {
      ASSERT_FALSE(x.is_contiguous());
      for (DType d : {kBFloat16, kFloat16}) {
        const Tensor fast = kernels::cast(x, d);
        EXPECT_TRUE(fast.is_contiguous());
        EXPECT_EQ(fast.shape(), x.shape());
        EXPECT_EQ(bits16(fast), bits16(x.contiguous().to(d))) << dtype_name(d) << " " << x.str() << ", " << threads;
        // Back up to f32 from a strided low-precision view.
        const Tensor low = fast.transpose(0, 1);
        EXPECT_EQ(kernels::cast(low, kFloat32).to_vector<float>(), low.contiguous().to(kFloat32).to_vector<float>())
            << dtype_name(d) << " " << low.str() << ", " << threads;
      }
    }
  }
}

TEST(AmpLowp, LinearEqualsF32MathOnRoundedOperands) {
  Generator gen(11);
  for (DType d : {kBFloat16, kFloat16}) {
    const Tensor x = kernels::cast(random_tensor({6, 9}, kFloat32, gen), d);
    const Tensor w = kernels::cast(random_tensor({4, 9}, kFloat32, gen), d);
    const Tensor b = kernels::cast(random_tensor({4}, kFloat32, gen), d);
    const Tensor y = kernels::lowp_linear_forward(x, w, b);
    ASSERT_EQ(y.dtype(), d);
    const Tensor ref = kernels::linear_forward(x.to(kFloat32), w.to(kFloat32), b.to(kFloat32)).to(d);
    EXPECT_TRUE(same_or_one_step(y, ref)) << dtype_name(d);

    const Tensor dy = kernels::cast(random_tensor({6, 4}, kFloat32, gen), d);
    const auto g = kernels::lowp_linear_backward(dy, x, w, true, true, true);
    const auto r = kernels::linear_backward(dy.to(kFloat32), x.to(kFloat32), w.to(kFloat32), true, true, true);
    ASSERT_EQ(g.input.dtype(), d);
    EXPECT_TRUE(same_or_one_step(g.input, r.input.to(d)));
    EXPECT_TRUE(same_or_one_step(g.weight, r.weight.to(d)));
    EXPECT_TRUE(same_or_one_step(g.bias, r.bias.to(d)));
    const auto only_w = kernels::lowp_linear_backward(dy, x, w, false, true, false);
    EXPECT_FALSE(only_w.input.defined());
    EXPECT_FALSE(only_w.bias.defined());
  }
}

TEST(AmpLowp, Conv2dEqualsF32MathOnRoundedOperands) {
  Generator gen(12);
  const DType d = kBFloat16;
  const kernels::Conv2dArgs args{2, 2, 1, 1};
  const Tensor x = kernels::cast(random_tensor({2, 3, 7, 6}, kFloat32, gen), d);
  const Tensor w = kernels::cast(random_tensor({5, 3, 3, 3}, kFloat32, gen), d);
  const Tensor b = kernels::cast(random_tensor({5}, kFloat32, gen), d);
  const Tensor y = kernels::lowp_conv2d_forward(x, w, b, args);
  ASSERT_EQ(y.dtype(), d);
  ASSERT_EQ(y.shape(), (Shape{2, 5, 4, 3}));
  EXPECT_TRUE(same_or_one_step(y, kernels::conv2d_forward(x.to(kFloat32), w.to(kFloat32), b.to(kFloat32), args).to(d)));
  const Tensor dy = kernels::cast(random_tensor(y.shape(), kFloat32, gen), d);
  const auto g = kernels::lowp_conv2d_backward(dy, x, w, args, true, true, true);
  const auto r = kernels::conv2d_backward(dy.to(kFloat32), x.to(kFloat32), w.to(kFloat32), args, true, true, true);
  EXPECT_TRUE(same_or_one_step(g.input, r.input.to(d)));
  EXPECT_TRUE(same_or_one_step(g.weight, r.weight.to(d)));
  EXPECT_TRUE(same_or_one_step(g.bias, r.bias.to(d)));
}

// A float32 input is rounded to the weight's dtype inside the op (oneDNN's input reorder on the
// native path): the same bits as casting it first, and its gradient is that low-precision gradient
// widened exactly, at each thread count (the pool's batch slices) and for both half types.
TEST(AmpLowp, Conv2dTakesAFloat32InputAsIfCastFirst) {
  for (int threads : {1, 2}) {
    ThreadCountGuard guard(threads);
    for (DType d : {kBFloat16, kFloat16}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + ", threads " + std::to_string(threads));
      Generator gen(21);
      const kernels::Conv2dArgs args{1, 1, 1, 1};
      const Tensor x = random_tensor({4, 16, 9, 7}, kFloat32, gen);
      const Tensor w = kernels::cast(random_tensor({16, 16, 3, 3}, kFloat32, gen), d);
      const Tensor b = kernels::cast(random_tensor({16}, kFloat32, gen), d);
      const Tensor xd = kernels::cast(x, d);
      const Tensor y = kernels::lowp_conv2d_forward(x, w, b, args);
      ASSERT_EQ(y.dtype(), d);
      EXPECT_EQ(bits16(y), bits16(kernels::lowp_conv2d_forward(xd, w, b, args)));
      const Tensor dy = kernels::cast(random_tensor(y.shape(), kFloat32, gen), d);
      const auto g = kernels::lowp_conv2d_backward(dy, x, w, args, true, true, true);
      const auto r = kernels::lowp_conv2d_backward(dy, xd, w, args, true, true, true);
      ASSERT_EQ(g.input.dtype(), kFloat32);
      EXPECT_EQ(values(g.input), values(kernels::cast(r.input, kFloat32)));
      EXPECT_EQ(bits16(g.weight), bits16(r.weight));
      EXPECT_EQ(bits16(g.bias), bits16(r.bias));
    }
  }
  Generator gen(22);
  const Tensor w = kernels::cast(random_tensor({2, 2, 1, 1}, kFloat32, gen), kBFloat16);
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::lowp_conv2d_forward(kernels::cast(random_tensor({1, 2, 3, 3}, kFloat32, gen), kFloat16), w, Tensor(),
                                     kernels::Conv2dArgs{});
      },
      {"lowp_conv2d_forward", "expected the input in bfloat16 (the weight's dtype) or float32, got float16"}));
}

// Autocast's f32 route: the one-channel conv (padding 0 or 1) stores its output in bf16 and reads a
// bf16 output gradient directly (AVX-512 builds); elsewhere an f32 conv and casts. Either way the bits of the f32
// conv followed by a cast, and of widening the gradient first, at any thread count, with row tails.
TEST(AmpLowp, F32RouteConvMatchesF32ConvAndCastsBitForBit) {
  for (int threads : {1, 2, 3}) {
    ThreadCountGuard guard(threads);
    for (const auto& [xs, pad] : {std::pair{Shape{5, 1, 13, 11}, 0}, std::pair{Shape{3, 1, 28, 28}, 0},
                                  std::pair{Shape{2, 4, 9, 9}, 0}, std::pair{Shape{3, 1, 28, 28}, 1},
                                  std::pair{Shape{4, 1, 7, 5}, 1}}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", x " + shape_str(xs) + ", padding " +
                   std::to_string(pad));
      Generator gen(23);
      const kernels::Conv2dArgs args{1, 1, pad, pad};
      const Tensor x = random_tensor(xs, kFloat32, gen), w = random_tensor({9, xs[1], 3, 3}, kFloat32, gen);
      const Tensor b = random_tensor({9}, kFloat32, gen);
      const Tensor y = kernels::autocast_f32_conv2d_forward(x, w, b, args, kBFloat16);
      ASSERT_EQ(y.dtype(), kBFloat16);
      EXPECT_EQ(bits16(y), bits16(kernels::cast(kernels::conv2d_forward(x, w, b, args), kBFloat16)));
      const Tensor gy = kernels::cast(random_tensor(y.shape(), kFloat32, gen), kBFloat16);
      const bool need_input = xs[1] > 1;
      const auto g = kernels::autocast_f32_conv2d_backward(gy, x, w, args, need_input, true, true);
      const auto r = kernels::conv2d_backward(kernels::cast(gy, kFloat32), x, w, args, need_input, true, true);
      EXPECT_EQ(values(g.weight), values(r.weight));
      EXPECT_EQ(values(g.bias), values(r.bias));
      EXPECT_EQ(g.input.defined(), need_input);
      if (need_input) {
        EXPECT_EQ(values(g.input), values(r.input));
      }
    }
  }
}

TEST(AmpLowp, RejectsMixedOrFullPrecisionOperands) {
  Generator gen(13);
  const Tensor x = random_tensor({2, 3}, kFloat32, gen), w = random_tensor({4, 3}, kFloat32, gen);
  EXPECT_TRUE(throws_with([&] { kernels::lowp_linear_forward(x, w, Tensor()); }, {"float16 or bfloat16"}));
  EXPECT_TRUE(throws_with([&] { kernels::lowp_linear_forward(x.to(kBFloat16), w.to(kFloat16), Tensor()); },
                          {"expected all tensors as bfloat16"}));
}

TEST(AmpUnscale, ScalesInPlaceAndFlagsNonFinite) {
  ThreadCountGuard threads(3);
  Generator gen(5);
  const Tensor g = random_tensor({100000}, kFloat32, gen, -100, 100);  // several pool chunks
  const auto before = g.to_vector<float>();
  Tensor flag = Tensor::zeros({1});
  kernels::unscale_and_check_(g, flag, 0.125);
  const auto after = g.to_vector<float>();
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(after[i], before[i] * 0.125f) << i;
  EXPECT_EQ(flag.item<float>(), 0.0f);

  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Tensor h = random_tensor({70000}, kFloat32, gen);
    h.data<float>()[65432] = bad;
    Tensor f = Tensor::zeros({1});
    kernels::unscale_and_check_(h, f, 0.5);
    EXPECT_EQ(f.item<float>(), 1.0f);
    Tensor clean = Tensor::ones({3});
    kernels::unscale_and_check_(clean, f, 0.5);  // a later clean tensor never clears the flag
    EXPECT_EQ(f.item<float>(), 1.0f);
    EXPECT_EQ(clean.to_vector<float>(), (std::vector<float>{0.5f, 0.5f, 0.5f}));
  }
  EXPECT_TRUE(throws_with([&] { kernels::unscale_and_check_(g.to(kFloat64), flag, 1.0); }, {"float32 gradient"}));
  EXPECT_TRUE(throws_with([&] { kernels::unscale_and_check_(g, Tensor::zeros({2}), 1.0); }, {"found_inf"}));
}
