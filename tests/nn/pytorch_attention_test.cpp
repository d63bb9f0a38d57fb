// Parity of scaled_dot_product_attention and MultiheadAttention (nn/attention.h,
// nn/attention_layer.h) with PyTorch 1.13: outputs, attention weights and gradients of inputs and
// parameters against tests/fixtures/attention.safetensors (made by
// tests/fixtures/make_attention_fixtures.py; its docstring lists the cases). The MultiheadAttention
// cases load PyTorch's state_dict into Tandem's module by name, which proves the names and shapes.
// Tolerance |actual - expected| <= 1e-5 + 1e-4 |expected| per element, as
// pytorch_general_ops_test.cpp: references are float64 rounded to float32, PyTorch's own float32
// results use at most 2.8% of the budget (the script prints it); a wrong mask, scale or head split
// gives errors of order 1e-2..1. The scaled_dot_product_attention cases without a mask run through
// the fused CPU kernel (kernels/attention.h) and through the composition.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "nn/attention.h"
#include "nn/attention_layer.h"
#include "nn/functional.h"
#include "nn/pytorch_fixture.h"

namespace {

using namespace tandem;
namespace Fn = tandem::nn::functional;

const tandem::testing::PytorchFixture& fixture() {
  static const tandem::testing::PytorchFixture f("attention.safetensors", "make_attention_fixtures.py");
  return f;
}

Tensor get(const std::string& name) { return fixture().get(name); }

void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  tandem::testing::expect_close_to_pytorch(actual, expected, what);
}

void check_sdpa_once(const std::string& c, const Tensor& mask, bool is_causal, std::optional<double> scale) {
  Tensor q = get(c + ".q").set_requires_grad(true), k = get(c + ".k").set_requires_grad(true),
         v = get(c + ".v").set_requires_grad(true);
  Tensor y = Fn::scaled_dot_product_attention(q, k, v, mask, 0.0, is_causal, scale);
  expect_close(y, get(c + ".y"), c + ".y");
  y.backward(get(c + ".R"));
  expect_close(q.grad(), get(c + ".grad_q"), c + ".grad_q");
  expect_close(k.grad(), get(c + ".grad_k"), c + ".grad_k");
  expect_close(v.grad(), get(c + ".grad_v"), c + ".grad_v");
}

// Through the fused CPU kernel where the case qualifies (no mask) and through the composition.
void check_sdpa(const std::string& c, const Tensor& mask, bool is_causal, std::optional<double> scale = std::nullopt) {
  for (const bool fused : {true, false}) {
    SCOPED_TRACE("case " + c + (fused ? " (fused where it applies)" : " (composed)"));
    Fn::set_fused_attention(fused);
    EXPECT_EQ(Fn::fused_attention_path(get(c + ".q"), get(c + ".k"), mask, 0.0), fused && !mask.defined());
    check_sdpa_once(c, mask, is_causal, scale);
  }
  Fn::set_fused_attention(true);
}

TEST(PytorchAttention, ScaledDotProductAttention) {
  check_sdpa("sdpa_plain", Tensor(), false);
  check_sdpa("sdpa_bcast", Tensor(), false);
  check_sdpa("sdpa_causal", Tensor(), true);
  check_sdpa("sdpa_causal_rect", Tensor(), true);
  check_sdpa("sdpa_bool_mask", get("sdpa_bool_mask.mask"), false);
  check_sdpa("sdpa_float_mask", get("sdpa_float_mask.mask"), false);
  check_sdpa("sdpa_scale", Tensor(), false, 0.3);
  check_sdpa("sdpa_scale_causal", Tensor(), true, 1.7);
}

std::map<std::string, Tensor> state_of(const std::string& c, const nn::Module& m) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : m.state_dict()) state[name] = get(c + "." + name);
  return state;
}

void check_param_grads(const std::string& c, const nn::Module& m) {
  for (const auto& [name, p] : m.named_parameters()) expect_close(p.grad(), get(c + ".grad_" + name), c + ".grad_" + name);
}

TEST(PytorchAttention, MultiheadAttentionWithPaddingAndAttnMasks) {
  nn::MultiheadAttention m(8, 2);
  const std::vector<std::string> names = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
  std::vector<std::string> got;
  for (const auto& [name, t] : m.state_dict()) got.push_back(name);
  EXPECT_EQ(got, names);  // PyTorch's names and order
  m.load_state_dict(state_of("mha", m));
  Tensor q = get("mha.query").set_requires_grad(true), k = get("mha.key").set_requires_grad(true),
         v = get("mha.value").set_requires_grad(true);
  auto r = m.forward(q, k, v, get("mha.key_padding_mask"), true, get("mha.attn_mask"));
  expect_close(r.output, get("mha.y"), "mha.y");
  expect_close(r.weights, get("mha.weights"), "mha.weights");
  r.output.backward(get("mha.R"));
  expect_close(q.grad(), get("mha.grad_query"), "mha.grad_query");
  expect_close(k.grad(), get("mha.grad_key"), "mha.grad_key");
  expect_close(v.grad(), get("mha.grad_value"), "mha.grad_value");
  check_param_grads("mha", m);
}

TEST(PytorchAttention, MultiheadAttentionCausalPerHeadWeights) {
  nn::MultiheadAttention m(8, 2);
  m.load_state_dict(state_of("mha_causal", m));
  Tensor x = get("mha_causal.x").set_requires_grad(true);
  auto r = m.forward(x, x, x, Tensor(), true, Tensor(), /*average_attn_weights=*/false, /*is_causal=*/true);
  expect_close(r.output, get("mha_causal.y"), "mha_causal.y");
  expect_close(r.weights, get("mha_causal.weights"), "mha_causal.weights");
  r.output.backward(get("mha_causal.R"));
  expect_close(x.grad(), get("mha_causal.grad_x"), "mha_causal.grad_x");
  check_param_grads("mha_causal", m);
  // Without the weights the causal mask alone goes to the fused CPU kernel: same output and gradients.
  m.zero_grad();
  Tensor x2 = get("mha_causal.x").set_requires_grad(true);
  auto r2 = m.forward(x2, x2, x2, Tensor(), /*need_weights=*/false, Tensor(), false, /*is_causal=*/true);
  EXPECT_FALSE(r2.weights.defined());
  expect_close(r2.output, get("mha_causal.y"), "mha_causal.y (fused)");
  r2.output.backward(get("mha_causal.R"));
  expect_close(x2.grad(), get("mha_causal.grad_x"), "mha_causal.grad_x (fused)");
  check_param_grads("mha_causal", m);
}

TEST(PytorchAttention, MultiheadAttentionSequenceFirstWithoutBias) {
  nn::MultiheadAttention m(8, 4, 0.0, /*bias=*/false, /*batch_first=*/false);
  EXPECT_EQ(m.state_dict().size(), 2u);  // in_proj_weight, out_proj.weight
  m.load_state_dict(state_of("mha_seq_first", m));
  Tensor x = get("mha_seq_first.x").set_requires_grad(true);
  auto r = m.forward(x, x, x, Tensor(), /*need_weights=*/false);
  EXPECT_FALSE(r.weights.defined());
  expect_close(r.output, get("mha_seq_first.y"), "mha_seq_first.y");
  r.output.backward(get("mha_seq_first.R"));
  expect_close(x.grad(), get("mha_seq_first.grad_x"), "mha_seq_first.grad_x");
  check_param_grads("mha_seq_first", m);
}

}  // namespace
