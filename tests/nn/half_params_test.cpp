// Modules with float16/bfloat16 parameters and no autocast (FSDP's mixed precision): linear and
// conv2d given a float32 input and a half weight compute in the weight's dtype, exactly as with the
// input cast by hand; a binary op with a half operand computes in float32 and sends a half gradient
// back; half gradients accumulate with Tensor::add_ in float math with one rounding.
#include <gtest/gtest.h>

#include <cstring>

#include "core/random.h"
#include "nn/functional.h"

using namespace tandem;

namespace {

Tensor uniform(const Shape& s, uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(g.uniform(-1, 1));
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST(HalfParams, LinearAndConvComputeInTheWeightsDtype) {
  for (DType half : {kBFloat16, kFloat16}) {
    Tensor w = uniform({4, 6}, 1).to(half).set_requires_grad(true);
    Tensor b = uniform({4}, 2).to(half).set_requires_grad(true);
    Tensor x = uniform({3, 6}, 3).set_requires_grad(true);
    Tensor y = F::linear(x, w, b);
    EXPECT_EQ(y.dtype(), half);
    EXPECT_TRUE(same_bits(y, F::linear(x.detach().to(half), w.detach(), b.detach())));
    F::sum(F::cast(y, kFloat32)).backward();
    EXPECT_EQ(w.grad().dtype(), half);
    EXPECT_EQ(x.grad().dtype(), kFloat32) << "the input's gradient comes back in its own dtype";

    Tensor k = uniform({2, 1, 3, 3}, 4).to(half);
    Tensor img = uniform({1, 1, 5, 5}, 5);
    Tensor c = F::conv2d(img, k, Tensor());
    EXPECT_EQ(c.dtype(), half);
    EXPECT_TRUE(same_bits(c, F::conv2d(img.to(half), k, Tensor())));
  }
}

TEST(HalfParams, BinaryOpsComputeAHalfOperandInFloat32) {
  Tensor a = uniform({5}, 6).set_requires_grad(true);
  Tensor h = uniform({5}, 7).to(kBFloat16).set_requires_grad(true);
  Tensor y = F::mul(a, h);
  EXPECT_EQ(y.dtype(), kFloat32);
  EXPECT_TRUE(same_bits(y, F::mul(a.detach(), h.detach().to(kFloat32))));
  EXPECT_EQ(F::add(h, 0.5).dtype(), kFloat32);
  F::sum(y).backward();
  EXPECT_EQ(h.grad().dtype(), kBFloat16);
  EXPECT_TRUE(same_bits(h.grad(), a.detach().to(kBFloat16)));
}

TEST(HalfParams, HalfGradientsAccumulateWithOneRounding) {
  // bfloat16 keeps 8 significant bits, so its values in [1, 2) are 2^-7 apart: 1 + 2^-9 (a quarter
  // step) rounds down to 1, 1 + 3 * 2^-9 (three quarters) up to 1 + 2^-7.
  Tensor acc = Tensor::from_vector<float>({1.0f, 1.0f, 2.0f}, {3}).to(kBFloat16);
  const float tiny = 1.0f / 512;
  acc.add_(Tensor::from_vector<float>({tiny, 3 * tiny, -0.5f}, {3}).to(kBFloat16));
  EXPECT_EQ(acc.to(kFloat32).to_vector<float>(), (std::vector<float>{1.0f, 1.0f + 1.0f / 128, 1.5f}));
  Tensor f16 = Tensor::from_vector<float>({0.25f, 1000.0f}, {2}).to(kFloat16);
  f16.add_(Tensor::from_vector<float>({0.5f, 0.25f}, {2}).to(kFloat16), 2.0);
  EXPECT_EQ(f16.to(kFloat32).to_vector<float>(), (std::vector<float>{1.25f, 1000.5f}));
}
