// scaled_dot_product_attention and MultiheadAttention (nn/attention.h, nn/attention_layer.h):
// float64 finite-difference gradient checks (tests/nn/gradcheck.h) for every mask kind, the causal
// mask's defining property (an output row does not change when later positions do), dropout,
// MultiheadAttention's shapes and initialisation (its gradients are checked against PyTorch's), and the errors bad arguments get. PyTorch parity is in
// pytorch_attention_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/attention_layer.h"
#include "nn/functional.h"
#include "tests/nn/gradcheck.h"

namespace {

using namespace tandem;
using tandem::testing::gradcheck;
using tandem::testing::random_f64;
using V = std::vector<Tensor>;

template <typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Attention, GradcheckPlainCausalAndMasks) {
  Generator g(3);
  const V base = {random_f64({2, 4, 3}, g), random_f64({2, 5, 3}, g), random_f64({2, 5, 2}, g)};
  // Fresh leaves for each check (a check accumulates gradients into its inputs).
  auto in_fn = [&] { return V{base[0].clone(), base[1].clone(), base[2].clone()}; };
  SCOPED_TRACE("plain");
  gradcheck([](const V& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2]); }, in_fn(), {0, 1, 2});
  SCOPED_TRACE("causal");
  gradcheck([](const V& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0.0, true); }, in_fn(),
            {0, 1, 2});
  Tensor bmask = F::causal_mask(4, 5);
  bmask.data<uint8_t>()[3 * 5 + 1] = 0;  // an extra hole
  SCOPED_TRACE("bool mask");
  gradcheck([&](const V& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], bmask); }, in_fn(), {0, 1, 2});
  const Tensor fmask = random_f64({2, 1, 5}, g);  // broadcast over L
  SCOPED_TRACE("float mask");
  gradcheck([&](const V& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], fmask); }, in_fn(), {0, 1, 2});
  // batch dimensions broadcast and non-contiguous operands
  SCOPED_TRACE("broadcast");
  const V in4 = {random_f64({2, 1, 3, 4}, g), random_f64({3, 4, 5}, g), random_f64({3, 5, 2}, g)};
  gradcheck([](const V& x) { return F::scaled_dot_product_attention(x[0], F::transpose(x[1], -2, -1), x[2], {}, 0.0, true); },
            in4, {0, 1, 2});
}

TEST(Attention, CausalRowsIgnoreLaterPositions) {
  Generator g(5);
  Tensor q = random_f64({1, 6, 4}, g), k = random_f64({1, 6, 4}, g), v = random_f64({1, 6, 3}, g);
  const std::vector<double> before = F::scaled_dot_product_attention(q, k, v, {}, 0.0, true).to_vector<double>();
  k.data<double>()[5 * 4 + 2] += 3.0;  // change position 5 only
  v.data<double>()[5 * 3 + 1] -= 2.0;
  const std::vector<double> after = F::scaled_dot_product_attention(q, k, v, {}, 0.0, true).to_vector<double>();
  for (int i = 0; i < 5 * 3; ++i) EXPECT_EQ(before[i], after[i]) << "row " << i / 3 << " saw position 5";
  bool last_changed = false;
  for (int i = 5 * 3; i < 6 * 3; ++i) last_changed |= before[i] != after[i];
  EXPECT_TRUE(last_changed);
  // Row 0 attends to position 0 alone: its output is v[0].
  for (int j = 0; j < 3; ++j) EXPECT_DOUBLE_EQ(after[j], v.data<double>()[j]);
  const std::vector<uint8_t> m = F::causal_mask(2, 3).to_vector<uint8_t>();
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 0, 0, 1, 1, 0}));
}

TEST(Attention, DropoutZeroesProbabilitiesAndIsSeeded) {
  Generator g(9);
  const Tensor q = random_f64({2, 8, 4}, g), k = random_f64({2, 8, 4}, g), v = Tensor::ones({2, 8, 1}, kFloat64);
  Generator a(1), b(1);
  const auto ya = F::scaled_dot_product_attention(q, k, v, {}, 0.5, false, a).to_vector<double>();
  const auto yb = F::scaled_dot_product_attention(q, k, v, {}, 0.5, false, b).to_vector<double>();
  EXPECT_EQ(ya, yb);
  // With v = 1 each output is the sum of a row's kept probabilities times 2: not all 1 any more.
  double off = 0.0;
  for (double y : ya) off = std::max(off, std::abs(y - 1.0));
  EXPECT_GT(off, 1e-3);
  const auto y0 = F::scaled_dot_product_attention(q, k, v).to_vector<double>();
  for (double y : y0) EXPECT_NEAR(y, 1.0, 1e-12);
}

TEST(Attention, ErrorsNameTheArgument) {
  const Tensor q = Tensor::zeros({2, 4, 3}), k = Tensor::zeros({2, 5, 3}), v = Tensor::zeros({2, 5, 2});
  expect_error([&] { F::scaled_dot_product_attention(Tensor::zeros({3}), k, v); }, "at least 2 dimensions");
  expect_error([&] { F::scaled_dot_product_attention(q, Tensor::zeros({2, 5, 4}), v); }, "last dimensions (E)");
  expect_error([&] { F::scaled_dot_product_attention(q, k, Tensor::zeros({2, 6, 2})); }, "same sequence length");
  expect_error([&] { F::scaled_dot_product_attention(q, k.to(kFloat64), v); }, "share a dtype");
  expect_error([&] { F::scaled_dot_product_attention(q, k, v, F::causal_mask(4, 5), 0.0, true); },
               "either attn_mask or is_causal");
  expect_error([&] { F::scaled_dot_product_attention(q, k, v, Tensor::zeros({4, 4}, kUInt8)); },
               "does not broadcast");
  expect_error([&] { F::scaled_dot_product_attention(q, k, v, Tensor::zeros({4, 5}, kInt64)); }, "attn_mask must be");
  expect_error([&] { F::scaled_dot_product_attention(q, k, v, {}, 1.5); }, "dropout_p");
  expect_error([&] { F::scaled_dot_product_attention(q, k, v, {}, 0.0, false, std::nan("")); },
               "scale must be a finite number, got nan");
  expect_error([] { nn::MultiheadAttention(10, 3); }, "divisible by num_heads");
  nn::MultiheadAttention m(6, 2);
  expect_error([&] { m.forward(Tensor::zeros({2, 4, 5})); }, "embed_dim = 6");
  const Tensor x = Tensor::zeros({2, 4, 6});
  expect_error([&] { m.forward(x, x, x, Tensor::zeros({2, 5}, kUInt8)); }, "key_padding_mask must be [2, 4]");
  expect_error([&] { m.forward(x, x, x, {}, true, Tensor::zeros({4, 5}, kUInt8)); }, "[L, S] = [4, 4]");
}

TEST(Attention, MultiheadAttentionShapesInitAndGradcheck) {
  manual_seed(0);
  nn::MultiheadAttention m(6, 3);
  EXPECT_EQ(shape_str(m.in_proj_weight.shape()), "[18, 6]");
  const double bound = std::sqrt(6.0 / 24.0);
  for (double w : m.in_proj_weight.to_vector<double>()) EXPECT_LE(std::abs(w), bound);
  for (double b : m.in_proj_bias.to_vector<double>()) EXPECT_EQ(b, 0.0);
  for (double b : m.out_proj->bias.to_vector<double>()) EXPECT_EQ(b, 0.0);
  const Tensor x = Tensor::ones({2, 4, 6});
  EXPECT_EQ(shape_str(m.forward(x).shape()), "[2, 4, 6]");
  auto r = m.forward(x, Tensor::ones({2, 7, 6}), Tensor::ones({2, 7, 6}));
  EXPECT_EQ(shape_str(r.weights.shape()), "[2, 4, 7]");
  auto u = m.forward(Tensor::ones({4, 6}), Tensor::ones({7, 6}), Tensor::ones({7, 6}), {}, true, {}, false);
  EXPECT_EQ(shape_str(u.output.shape()), "[4, 6]");
  EXPECT_EQ(shape_str(u.weights.shape()), "[3, 4, 7]");
}

}  // namespace
