// The SIMD layer of the CPU kernels (kernels/cpu/simd.h) and its record of which path each kernel
// call took. The level expected here is this translation unit's own, read from the compiler's
// macros (__AVX512F__, __AVX2__ and __FMA__), as the tests are compiled with the library's flags;
// the library must agree. Every kernel with vector rows is called once in float32 and must count
// one call on the rows of the build's level where it has rows at that level (the table below),
// else on the portable rows; once in float64, which must count a portable call; arguments its vector
// rows do not cover must count portable too. TANDEM_EXPECT_SIMD=avx512|avx2|portable (CI's
// x86-64-v3 stage sets avx2) makes the build's level a requirement.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <vector>
#include <functional>
#include <string>

#include "kernels/ops.h"
#include "kernel_test_util.h"
#include "kernels/attention.h"
#include "kernels/batch_norm.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/conv.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/simd.h"
#include "kernels/linear.h"
#include "kernels/pool.h"

using namespace tandem;
using namespace tandem::test;
using kernels::cpu::SimdKernel;
using kernels::cpu::SimdLevel;

namespace {

#if defined(__AVX512F__)
constexpr SimdLevel kTestLevel = SimdLevel::avx512;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr SimdLevel kTestLevel = SimdLevel::avx2;
#else
constexpr SimdLevel kTestLevel = SimdLevel::portable;
#endif

constexpr SimdLevel kLevels[] = {SimdLevel::portable, SimdLevel::avx2, SimdLevel::avx512};

// The levels a kernel has vector rows for: AVX-512 for all of them, AVX2 for some.
enum class Rows { avx512, avx512_and_avx2 };

// The path a float32 call with covered arguments takes in this build.
SimdLevel float_path(Rows rows) {
  if (kTestLevel == SimdLevel::avx512) return SimdLevel::avx512;
  if (kTestLevel == SimdLevel::avx2 && rows == Rows::avx512_and_avx2) return SimdLevel::avx2;
  return SimdLevel::portable;
}

// Expects fn() to count exactly one call of `kernel`, on the path of `level`.
void expect_path(SimdKernel kernel, SimdLevel level, const std::function<void()>& fn) {
  uint64_t before[3];
  for (SimdLevel l : kLevels) before[int(l)] = kernels::cpu::simd_path_count(kernel, l);
  fn();
  for (SimdLevel l : kLevels) {
    EXPECT_EQ(kernels::cpu::simd_path_count(kernel, l) - before[int(l)], l == level ? 1u : 0u)
        << "kernel " << int(kernel) << ", calls counted on the " << kernels::cpu::simd_level_name(l)
        << " path (expected one call on the " << kernels::cpu::simd_level_name(level) << " path)";
  }
}

// Expects one call on float_path(rows) in float32 and one portable call in float64.
void expect_paths(SimdKernel kernel, Rows rows, const std::function<void(DType)>& call) {
  {
    SCOPED_TRACE("float32");
    expect_path(kernel, float_path(rows), [&] { call(kFloat32); });
  }
  {
    SCOPED_TRACE("float64");
    expect_path(kernel, SimdLevel::portable, [&] { call(kFloat64); });
  }
}

struct BnCase {
  Tensor x, w, b, rm, rv, gy, gy_pooled;
  BnCase(DType dtype, const Shape& shape) {
    Generator gen(7);
    const int64_t C = shape[1];
    x = random_tensor(shape, dtype, gen, -2.0, 2.0);
    w = random_tensor({C}, dtype, gen, 0.5, 1.5);
    b = random_tensor({C}, dtype, gen, -0.5, 0.5);
    rm = Tensor::zeros({C}, dtype);
    rv = Tensor::ones({C}, dtype);
    gy = random_tensor(shape, dtype, gen);
    gy_pooled = random_tensor({shape[0], C, shape[2] / 2, shape[3] / 2}, dtype, gen);
  }
};

const Shape kBnShape{2, 3, 7, 21};  // odd H and W, rows of 21: a full vector and a ragged end

// A fused batch-norm pair: forward(case) counted on fwd, backward(case, forward's result) on bwd.
template <typename Forward, typename Backward>
void expect_bn_paths(SimdKernel fwd, SimdKernel bwd, Rows rows, Forward forward, Backward backward) {
  expect_paths(fwd, rows, [&](DType dtype) { forward(BnCase(dtype, kBnShape)); });
  expect_paths(bwd, rows, [&](DType dtype) {
    const BnCase c(dtype, kBnShape);
    backward(c, forward(c));
  });
}

}  // namespace

TEST(Simd, LibraryCompiledAtTheTestsLevel) {
  EXPECT_EQ(kernels::cpu::kSimdLevel, kTestLevel);
  EXPECT_STREQ(kernels::cpu::simd_level_name(kernels::cpu::compiled_simd_level()),
               kernels::cpu::simd_level_name(kTestLevel));
}

TEST(Simd, LevelIsTheExpectedOneWhenTheEnvironmentNamesIt) {
  const char* expected = std::getenv("TANDEM_EXPECT_SIMD");
  if (expected == nullptr || *expected == '\0') GTEST_SKIP() << "TANDEM_EXPECT_SIMD is not set";
  const std::string want = expected;
  ASSERT_TRUE(want == "avx512" || want == "avx2" || want == "portable")
      << "TANDEM_EXPECT_SIMD=" << want << ": expected avx512, avx2 or portable";
  EXPECT_EQ(kernels::cpu::simd_level_name(kernels::cpu::compiled_simd_level()), want)
      << "the CPU kernels were compiled for another instruction-set level than TANDEM_EXPECT_SIMD";
}

TEST(Simd, LevelNames) {
  EXPECT_STREQ(kernels::cpu::simd_level_name(SimdLevel::portable), "portable");
  EXPECT_STREQ(kernels::cpu::simd_level_name(SimdLevel::avx2), "avx2");
  EXPECT_STREQ(kernels::cpu::simd_level_name(SimdLevel::avx512), "avx512");
}

TEST(Simd, BatchNormReluCountsItsPath) {
  expect_bn_paths(
      SimdKernel::bn_relu_forward, SimdKernel::bn_relu_backward, Rows::avx512,
      [](const BnCase& c) { return kernels::batch_norm_relu_forward(c.x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5); },
      [](const BnCase& c, const auto& f) {
        kernels::batch_norm_relu_backward(c.gy, c.x, c.w, c.b, f.save_mean, f.save_invstd, true, true, true, true);
      });
}

TEST(Simd, BatchNormReluMaxPoolCountsItsPath) {
  expect_bn_paths(
      SimdKernel::bn_relu_pool_forward, SimdKernel::bn_relu_pool_backward, Rows::avx512_and_avx2,
      [](const BnCase& c) {
        return kernels::batch_norm_relu_max_pool2d_forward(c.x, c.w, c.b, c.rm, c.rv, true, 0.1, 1e-5);
      },
      [](const BnCase& c, const auto& f) {
        kernels::batch_norm_relu_max_pool2d_backward(c.gy_pooled, c.x, f.code, f.winner, c.w, c.b, f.save_mean,
                                                     f.save_invstd, true, true, true, true);
      });
}

TEST(Simd, Conv2dPairCountsItsPath) {
  // The ResNet's 8->16 block shape at a smaller side: the fused stride-2 kernels (float32, AVX-512).
  auto tensors = [](DType dtype) {
    Generator gen(11);
    return std::vector<Tensor>{random_tensor({2, 8, 13, 12}, dtype, gen), random_tensor({16, 8, 3, 3}, dtype, gen),
                               random_tensor({16, 8, 1, 1}, dtype, gen), random_tensor({2, 16, 7, 6}, dtype, gen)};
  };
  expect_paths(SimdKernel::conv2d_pair_forward, Rows::avx512, [&](DType dtype) {
    const auto t = tensors(dtype);
    kernels::conv2d_pair_forward(t[0], t[1], t[2]);
  });
  expect_paths(SimdKernel::conv2d_pair_backward, Rows::avx512, [&](DType dtype) {
    const auto t = tensors(dtype);
    kernels::conv2d_pair_backward(t[3], t[3], t[0], t[1], t[2], true, true, true);
  });
}

TEST(Simd, Conv2dCountsItsPath) {
  // cin 3 (the column matrix) and cin 1 (the direct one-channel 3x3 kernels), stride 1.
  for (int64_t cin : {3, 1}) {
    SCOPED_TRACE("input channels " + std::to_string(cin));
    auto tensors = [cin](DType dtype) {
      Generator gen(8);
      return std::vector<Tensor>{random_tensor({2, cin, 9, 21}, dtype, gen),
                                 random_tensor({4, cin, 3, 3}, dtype, gen), random_tensor({4}, dtype, gen),
                                 random_tensor({2, 4, 7, 19}, dtype, gen)};
    };
    expect_paths(SimdKernel::conv2d_forward, Rows::avx512, [&](DType dtype) {
      const auto t = tensors(dtype);
      kernels::conv2d_forward(t[0], t[1], t[2], kernels::Conv2dArgs{});
    });
    expect_paths(SimdKernel::conv2d_backward, Rows::avx512, [&](DType dtype) {
      const auto t = tensors(dtype);
      kernels::conv2d_backward(t[3], t[0], t[1], kernels::Conv2dArgs{}, true, true, true);
    });
    expect_paths(SimdKernel::conv2d_backward, Rows::avx512, [&](DType dtype) {  // weight and bias only
      const auto t = tensors(dtype);
      kernels::conv2d_backward(t[3], t[0], t[1], kernels::Conv2dArgs{}, false, true, true);
    });
  }
  // Stride 2 both ways, 3x3 and 1x1: the direct strided kernels' vector rows (float32).
  for (int64_t k : {3, 1}) {
    SCOPED_TRACE("kernel " + std::to_string(k));
    kernels::Conv2dArgs two{2, 2, k / 2, k / 2};
    auto tensors = [k](DType dtype) {
      Generator gen(10);
      // 19 x 20 images: 10 x 10 outputs with either kernel.
      return std::vector<Tensor>{random_tensor({2, 3, 19, 20}, dtype, gen), random_tensor({4, 3, k, k}, dtype, gen),
                                 random_tensor({4}, dtype, gen), random_tensor({2, 4, 10, 10}, dtype, gen)};
    };
    expect_paths(SimdKernel::conv2d_forward, Rows::avx512, [&](DType dtype) {
      const auto t = tensors(dtype);
      kernels::conv2d_forward(t[0], t[1], t[2], two);
    });
    expect_paths(SimdKernel::conv2d_backward, Rows::avx512, [&](DType dtype) {
      const auto t = tensors(dtype);
      kernels::conv2d_backward(t[3], t[0], t[1], two, true, true, true);
    });
  }
  // Stride 2 in width only: no vector rows at any level.
  Generator gen(9);
  const Tensor x = random_tensor({2, 3, 9, 21}, kFloat32, gen), w = random_tensor({4, 3, 3, 3}, kFloat32, gen);
  kernels::Conv2dArgs strided;
  strided.stride_w = 2;
  expect_path(SimdKernel::conv2d_forward, SimdLevel::portable,
              [&] { kernels::conv2d_forward(x, w, Tensor(), strided); });
}

TEST(Simd, MaxPool2dCountsItsPath) {
  expect_paths(SimdKernel::max_pool2d_forward, Rows::avx512, [](DType dtype) {
    Generator gen(10);
    kernels::max_pool2d_forward(random_tensor({2, 3, 8, 42}, dtype, gen), kernels::MaxPool2dArgs{});
  });
  // 3x3 windows: no vector rows at any level.
  Generator gen(11);
  kernels::MaxPool2dArgs three;
  three.kernel_h = three.kernel_w = 3;
  expect_path(SimdKernel::max_pool2d_forward, SimdLevel::portable, [&] {
    kernels::max_pool2d_forward(random_tensor({2, 3, 8, 42}, kFloat32, gen), three);
  });
}

TEST(Simd, LinearCountsItsPath) {
  // Batch 8 and products of 2^18 multiply-adds: the small GEMM's shapes (the input gradient needs
  // 256 output features).
  auto tensors = [](DType dtype) {
    Generator gen(12);
    return std::vector<Tensor>{random_tensor({8, 128}, dtype, gen), random_tensor({256, 128}, dtype, gen),
                               random_tensor({256}, dtype, gen), random_tensor({8, 256}, dtype, gen)};
  };
  expect_paths(SimdKernel::linear_forward, Rows::avx512, [&](DType dtype) {
    const auto t = tensors(dtype);
    kernels::linear_forward(t[0], t[1], t[2]);
  });
  expect_paths(SimdKernel::linear_backward, Rows::avx512, [&](DType dtype) {
    const auto t = tensors(dtype);
    kernels::linear_backward(t[3], t[0], t[1], true, true, true);
  });
  // A small product (batch 2, 4 x 3): Eigen at every level.
  Generator gen(13);
  const Tensor x = random_tensor({2, 3}, kFloat32, gen), w = random_tensor({4, 3}, kFloat32, gen);
  expect_path(SimdKernel::linear_forward, SimdLevel::portable, [&] { kernels::linear_forward(x, w, Tensor()); });
}

TEST(Simd, AttentionCountsItsPath) {
  // A causal entry of 70 query rows (two blocks) and a value width past one vector.
  auto tensors = [](DType dtype) {
    Generator gen(14);
    return std::vector<Tensor>{random_tensor({2, 70, 12}, dtype, gen), random_tensor({2, 70, 12}, dtype, gen),
                               random_tensor({2, 70, 20}, dtype, gen), random_tensor({2, 70, 20}, dtype, gen)};
  };
  expect_paths(SimdKernel::attention_forward, Rows::avx512, [&](DType dtype) {
    const auto t = tensors(dtype);
    kernels::attention_forward(t[0], t[1], t[2], 0.3, true);
  });
  expect_paths(SimdKernel::attention_backward, Rows::avx512, [&](DType dtype) {
    const auto t = tensors(dtype);
    const kernels::AttentionForward f = kernels::attention_forward(t[0], t[1], t[2], 0.3, true);
    kernels::attention_backward(t[3], t[0], t[1], t[2], f.output, f.lse, 0.3, true);
  });
}

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// The vector bf16 conversions against the scalar ones (Tensor::to's round to nearest even, NaN kept
// NaN): every rounding case, infinities, NaN, denormals; a partial vector touches only its n lanes.
TEST(Simd, Bf16LanesConvertAsTheScalarCast) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {1.0f,        1.00390625f, 1.0078125f, 1.01171875f, -3.14159f, 65504.0f, 1e-40f,
                                -1e-39f,     inf,         -inf,       nan,         0.0f,      -0.0f,    3.3895314e38f,
                                1.5f + 1e-7f, 2.0f};
  const Tensor src = Tensor::from_vector<float>(v, {16});
  const Tensor want = src.to(kBFloat16);
  const auto* want_bits = static_cast<const uint16_t*>(want.raw_data());
  for (int64_t n : {16, 11, 1, 0}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<uint16_t> out(17, 0xABCD);
    kernels::cpu::simd::store_first(out.data(), _mm512_loadu_ps(v.data()), n);
    for (int64_t i = 0; i < 17; ++i) EXPECT_EQ(out[i], i < n ? want_bits[i] : uint16_t{0xABCD}) << "lane " << i;
    float back[16];
    _mm512_storeu_ps(back, kernels::cpu::simd::load_first(want_bits, n));
    const Tensor widened = want.to(kFloat32);
    for (int64_t i = 0; i < 16; ++i) {
      const float w = i < n ? widened.data<float>()[i] : 0.0f;
      EXPECT_TRUE(back[i] == w || (std::isnan(back[i]) && std::isnan(w))) << "lane " << i;
    }
  }
  // Random bit patterns, every class: vectors of normals only (where the build has AVX512_BF16, the
  // CPU's conversion) and vectors with a denormal among them (the integer rounding), against the scalar.
  uint64_t state = 0x9E3779B97F4A7C15ull;
  int64_t mismatches = 0;
  for (int round = 0; round < 20000; ++round) {
    alignas(64) uint32_t bits[16];
    for (uint32_t& b : bits) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b = uint32_t(state >> 32);
      if (round % 4 == 1) b &= 0x807FFFFFu;  // denormals (or zero) in every lane
      if (round % 4 == 2 && (&b - bits) == 5) b &= 0x807FFFFFu;  // one denormal among normals
    }
    float f[16];
    std::memcpy(f, bits, sizeof f);
    uint16_t out[16];
    kernels::cpu::simd::store_first(out, _mm512_loadu_ps(f), 16);
    for (int i = 0; i < 16; ++i) mismatches += out[i] != kernels::cpu::detail::f32_to_bf16_bits(f[i]);
  }
  EXPECT_EQ(mismatches, 0);
}
#endif
