// ops_tour: the general op set (broadcasting, reductions, views, batched matmul, softmax, losses,
// layer_norm, embedding, dropout) in one small self-attention step, each piece checked against a
// value worked out by hand. docs/embedding.md quotes the marked regions, so the documentation's
// examples are compiled and run by scripts/ci/embed.sh.
// Guarantees: exit 0 when every value is as expected; otherwise prints which one differed, exit 1.
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "nn/functional.h"
#include "nn/layers_general.h"

using namespace tandem;

namespace {

int failures = 0;
void expect_near(const char* what, double got, double want) {
  if (!(std::abs(got - want) <= 1e-5)) {
    std::printf("ops_tour: %s = %.6f, expected %.6f\n", what, got, want);
    ++failures;
  }
}

void demo_elementwise_and_reductions() {
  // [ops-elementwise]
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor bias = Tensor::from_vector(std::vector<float>{10, 20, 30}, {3});
  Tensor y = F::add(x, bias);                      // [2, 3] + [3] broadcasts: {11, 22, 33, 14, 25, 36}
  Tensor half = F::div(x, 2.0);                    // scalar forms: add/sub/mul/div/pow(t, s)
  Tensor mask = F::gt(x, 3.0);                     // uint8 0/1 mask: {0, 0, 0, 1, 1, 1}
  Tensor kept = F::where(mask, x, F::neg(x));      // {-1, -2, -3, 4, 5, 6}
  Tensor act = F::gelu(x, "tanh");                 // also exp log sqrt rsqrt tanh sigmoid silu
  Tensor row_sum = F::sum(x, {1});                 // {6, 15}
  Tensor col_mean = F::mean(x, {0}, /*keepdim=*/true);  // [1, 3]: {2.5, 3.5, 4.5}
  Tensor v = F::var(x, {1});                       // unbiased (correction 1): {1, 1}
  auto [values, indices] = F::max(x, 1);           // {3, 6} at {2, 2}
  Tensor lse = F::logsumexp(x, {0, 1});            // log(sum(exp(x))) over everything
  // [ops-elementwise]
  expect_near("y[5]", y.to_vector<float>()[5], 36);
  expect_near("half[1]", half.to_vector<float>()[1], 1);
  expect_near("kept[0]", kept.to_vector<float>()[0], -1);
  expect_near("kept[3]", kept.to_vector<float>()[3], 4);
  expect_near("act[0]", act.to_vector<float>()[0], 0.5 * (1 + std::tanh(0.7978845608 * (1 + 0.044715))));
  expect_near("row_sum[1]", row_sum.to_vector<float>()[1], 15);
  expect_near("col_mean[2]", col_mean.to_vector<float>()[2], 4.5);
  expect_near("var[0]", v.to_vector<float>()[0], 1);
  expect_near("max[1]", values.to_vector<float>()[1], 6);
  expect_near("argmax[1]", static_cast<double>(indices.to_vector<int64_t>()[1]), 2);
  double s = 0;
  for (int i = 1; i <= 6; ++i) s += std::exp(static_cast<double>(i));
  expect_near("logsumexp", lse.item<double>(), std::log(s));
}

void demo_attention() {
  manual_seed(0);
  // [ops-attention]
  const int64_t B = 2, T = 3, D = 4, V = 10;
  nn::Embedding embed(V, D);
  nn::LayerNorm norm(Shape{D});
  Tensor tokens = Tensor::from_vector<int64_t>({1, 5, 2, 7, 7, 0}, {B, T});
  Tensor h = norm(embed(tokens));                                  // [B, T, D]
  Tensor scores = F::div(F::matmul(h, F::transpose(h, 1, 2)),     // [B, T, T], batched matmul
                         std::sqrt(static_cast<double>(D)));
  Tensor attn = F::softmax(scores, -1);                            // rows sum to 1
  Tensor ctx = F::matmul(attn, h);                                 // [B, T, D]
  Tensor heads = F::permute(F::reshape(ctx, {B, T, 2, D / 2}), {0, 2, 1, 3});  // [B, 2, T, D/2]
  Tensor merged = F::reshape(F::transpose(heads, 1, 2), {B, T, D});            // back to [B, T, D]
  Tensor logits = F::linear(F::dropout(merged, 0.1, /*training=*/true),        // any rank [..., in]
                            embed.weight, Tensor());                           // tied weights: [B, T, V]
  Tensor target = Tensor::from_vector<int64_t>({5, 2, -100, 7, 0, 3}, {B, T});
  Tensor loss = F::cross_entropy(F::permute(logits, {0, 2, 1}), target,        // [N, C, T] as PyTorch
                                 /*ignore_index=*/-100, /*label_smoothing=*/0.1);
  loss.backward();                                   // gradients reach embed.weight and norm.weight
  // [ops-attention]
  const std::vector<float> a = attn.to_vector<float>();
  expect_near("attention row sum", a[0] + a[1] + a[2], 1);
  expect_near("merged == ctx", F::sum(F::sub(merged, ctx)).item<double>(), 0);
  if (!std::isfinite(loss.item<double>()) || !embed.weight.grad().defined() || !norm.weight.grad().defined()) {
    std::printf("ops_tour: attention loss or gradients missing\n");
    ++failures;
  }

  // [ops-views]
  Tensor x = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor parts = F::cat(F::chunk(x, 3, /*dim=*/1), 0);             // [6, 1]: {0, 3, 1, 4, 2, 5}
  Tensor both = F::stack({x, x}, 0);                               // [2, 2, 3]
  Tensor picked = F::gather(x, 1, Tensor::from_vector<int64_t>({2, 0}, {2, 1}));  // {2, 3}
  Tensor rows = F::index_select(x, 0, Tensor::from_vector<int64_t>({1, 1}, {2}));  // [2, 3]
  Tensor wide = F::expand(F::unsqueeze(F::select(x, 0, 0), 0), {4, 3});            // a view, no copy
  // [ops-views]
  expect_near("parts[1]", parts.to_vector<float>()[1], 3);
  expect_near("both size", static_cast<double>(both.numel()), 12);
  expect_near("picked[0]", picked.to_vector<float>()[0], 2);
  expect_near("rows[0]", rows.to_vector<float>()[0], 3);
  expect_near("wide[11]", wide.to_vector<float>()[11], 2);

  try {
    F::add(Tensor::ones({2, 3}), Tensor::ones({2}));  // [2, 3] and [2] do not broadcast
    std::printf("ops_tour: no error for shapes that do not broadcast\n");
    ++failures;
  } catch (const tandem::Error& e) {
    std::printf("caught as expected: %s\n", e.what());
  }
}

}  // namespace

int main() {
  demo_elementwise_and_reductions();
  demo_attention();
  if (failures == 0) std::printf("ops_tour: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
