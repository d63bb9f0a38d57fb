// Modules with float16/bfloat16 parameters and no autocast (FSDP's mixed precision): linear and
// conv2d given a float32 input and a half weight compute in the weight's dtype, exactly as with the
// input cast by hand; a binary op with a half operand computes in float32 and sends a half gradient
// back; half gradients accumulate with Tensor::add_ in float math with one rounding; a transformer
// block (embedding, layer_norm, attention, GELU, a weight used twice) runs with half parameters.
#include <gtest/gtest.h>

#include <cstring>

#include "core/random.h"
#include "nn/attention_layer.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/layers_general.h"

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

namespace {

// The examples' GPT in small: a tied embedding, layer norm, causal self-attention, an MLP with GELU.
class TinyGpt : public nn::Module {
 public:
  TinyGpt() {
    wte = register_module("wte", std::make_shared<nn::Embedding>(11, 8));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(Shape{8}));
    attn = register_module("attn", std::make_shared<nn::MultiheadAttention>(8, 2, 0.0));
    fc = register_module("fc", std::make_shared<nn::Linear>(8, 8));
  }
  Tensor forward(const Tensor& idx) override {
    Tensor x = wte->forward(idx);
    const Tensor h = ln->forward(x);
    x = F::add(x, attn->forward(h, h, h, Tensor(), false, Tensor(), true, /*is_causal=*/true).output);
    x = F::add(x, F::gelu(fc->forward(x)));
    return F::linear(x, wte->weight, Tensor());  // tied
  }
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::MultiheadAttention> attn;
  std::shared_ptr<nn::Linear> fc;
};

double loss_of(TinyGpt& m, const Tensor& idx, const Tensor& target) {
  Tensor logits = F::reshape(m.forward(idx), {-1, 11});
  Tensor loss = F::cross_entropy(logits, target);
  loss.backward();
  return loss.to(kFloat64).data<double>()[0];
}

}  // namespace

TEST(HalfParams, ATransformerBlockRunsWithBfloat16Parameters) {
  manual_seed(9);
  TinyGpt f32;
  manual_seed(9);
  TinyGpt bf16;
  for (auto& [name, p] : bf16.named_parameters()) const_cast<Tensor&>(p).set_data(p.detach().to(kBFloat16));
  const Tensor idx = Tensor::from_vector<int64_t>({1, 4, 2, 7, 3, 0, 9, 5}, {2, 4});
  const Tensor target = Tensor::from_vector<int64_t>({4, 2, 7, 3, 0, 9, 5, 1}, {8});
  const double want = loss_of(f32, idx, target), got = loss_of(bf16, idx, target);
  EXPECT_NEAR(got, want, 0.02 * want) << "bfloat16 keeps 8 significant bits";
  for (auto& [name, p] : bf16.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), kBFloat16) << name;
  }
}
