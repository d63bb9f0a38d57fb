// The fused CPU kernel of scaled_dot_product_attention (kernels/attention.h, taken by
// nn/attention.cpp on the CPU without dropout and with no mask or the causal one) against the
// composed path (set_fused_attention(false)): the output and the three gradients, float64 to 1e-12
// and float32 to 1e-5 relative, for shapes that cross the kernel's 64-row and 64-column blocks,
// L != S, Ev != E and broadcast batch dimensions; the kernel's profiler entries prove which path
// ran; thread counts 1..3 give the same bits; float64 finite-difference gradients through the fused
// path; the graph is freed with its output; masks and dropout fall back (a row with nothing to attend gives NaN, as PyTorch).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/profiler.h"
#include "core/thread_pool.h"
#include "nn/attention.h"
#include "nn/functional.h"
#include "tests/nn/gradcheck.h"

namespace {

using namespace tandem;
using tandem::testing::gradcheck;
using tandem::testing::random_f64;
using V = std::vector<Tensor>;

// Sets the fused switch for a scope, restoring the default (on) after.
struct FusedSwitch {
  explicit FusedSwitch(bool on) { F::set_fused_attention(on); }
  ~FusedSwitch() { F::set_fused_attention(true); }
};

struct Result {
  Tensor y, gq, gk, gv;
};

// Output and gradients of sum(sdpa(q, k, v) * R) on fresh leaves of the inputs.
Result run(const V& in, const Tensor& R, bool is_causal, bool fused, const Tensor& mask = Tensor()) {
  FusedSwitch sw(fused);
  Tensor q = in[0].clone().set_requires_grad(true), k = in[1].clone().set_requires_grad(true),
         v = in[2].clone().set_requires_grad(true);
  Tensor y = F::scaled_dot_product_attention(q, k, v, mask, 0.0, is_causal);
  y.backward(R);
  return {y.detach(), q.grad(), k.grad(), v.grad()};
}

void expect_close(const Tensor& a, const Tensor& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double scale = 0.0;
  for (double v : y) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(x[i], y[i], rtol * (std::abs(y[i]) + 0.1 * scale)) << what << " element " << i;
  }
}

Tensor random_of(const Shape& shape, DType dtype, Generator& g) { return random_f64(shape, g, -2.0, 2.0).to(dtype); }

// Calls of the fused kernel (forward, backward) while fn runs.
template <typename Fn>
std::pair<int64_t, int64_t> fused_calls(Fn&& fn) {
  profiler::reset();
  profiler::set_enabled(true);
  fn();
  profiler::set_enabled(false);
  int64_t fwd = 0, bwd = 0;
  for (const auto& s : profiler::snapshot()) {
    if (s.op == "attention") fwd += s.calls;
    if (s.op == "attention_backward") bwd += s.calls;
  }
  profiler::reset();
  return {fwd, bwd};
}

struct Case {
  Shape q, k, v;
  bool causal;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{2, 5, 4}, {2, 5, 4}, {2, 5, 4}, false},
      {{2, 5, 4}, {2, 5, 4}, {2, 5, 4}, true},
      {{3, 64, 16}, {3, 64, 16}, {3, 64, 16}, true},            // GPT's head: one block
      {{2, 70, 8}, {2, 130, 8}, {2, 130, 5}, false},            // L != S, Ev != E, several blocks
      {{2, 130, 8}, {2, 70, 8}, {2, 70, 5}, true},              // causal with L > S
      {{1, 70, 3}, {1, 200, 3}, {1, 200, 6}, true},             // causal with S > L
      {{2, 1, 9, 4}, {3, 11, 4}, {3, 11, 2}, true},             // broadcast batch dimensions
      {{9, 4}, {11, 4}, {11, 7}, false},                        // no batch dimension
  };
  return c;
}

void compare_paths(DType dtype, double rtol) {
  Generator g(11);
  for (const Case& c : cases()) {
    SCOPED_TRACE("q " + shape_str(c.q) + " k " + shape_str(c.k) + " v " + shape_str(c.v) +
                 (c.causal ? " causal" : ""));
    const V in = {random_of(c.q, dtype, g), random_of(c.k, dtype, g), random_of(c.v, dtype, g)};
    const Shape y_shape = F::scaled_dot_product_attention(in[0], in[1], in[2], {}, 0.0, c.causal).shape();
    const Tensor R = random_of(y_shape, dtype, g);
    const Result composed = run(in, R, c.causal, false);
    Result fused;
    const auto calls = fused_calls([&] { fused = run(in, R, c.causal, true); });
    EXPECT_EQ(calls.first, 1);
    EXPECT_EQ(calls.second, 1);
    expect_close(fused.y, composed.y, rtol, "output");
    expect_close(fused.gq, composed.gq, rtol, "grad q");
    expect_close(fused.gk, composed.gk, rtol, "grad k");
    expect_close(fused.gv, composed.gv, rtol, "grad v");
  }
}

TEST(FusedAttention, MatchesComposedPathFloat64) { compare_paths(kFloat64, 1e-12); }

TEST(FusedAttention, MatchesComposedPathFloat32) { compare_paths(kFloat32, 1e-5); }

TEST(FusedAttention, SameBitsForOneToThreeThreads) {
  Generator g(4);
  const V in = {random_of({7, 100, 16}, kFloat32, g), random_of({7, 90, 16}, kFloat32, g),
                random_of({7, 90, 12}, kFloat32, g)};
  const Tensor R = random_of({7, 100, 12}, kFloat32, g);
  const int saved = num_threads();
  std::vector<Result> runs;
  for (int t = 1; t <= 3; ++t) {
    set_num_threads(t);
    runs.push_back(run(in, R, /*is_causal=*/true, true));
  }
  set_num_threads(saved);
  for (int t = 1; t < 3; ++t) {
    SCOPED_TRACE("threads " + std::to_string(t + 1));
    EXPECT_EQ(runs[t].y.to_vector<float>(), runs[0].y.to_vector<float>());
    EXPECT_EQ(runs[t].gq.to_vector<float>(), runs[0].gq.to_vector<float>());
    EXPECT_EQ(runs[t].gk.to_vector<float>(), runs[0].gk.to_vector<float>());
    EXPECT_EQ(runs[t].gv.to_vector<float>(), runs[0].gv.to_vector<float>());
  }
}

TEST(FusedAttention, GradcheckThroughTheFusedPath) {
  Generator g(8);
  ASSERT_TRUE(F::fused_attention_enabled());
  SCOPED_TRACE("causal, L > S, blocks crossed");
  gradcheck([](const V& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0.0, true); },
            {random_f64({1, 70, 3}, g), random_f64({1, 66, 3}, g), random_f64({1, 66, 2}, g)}, {0, 1, 2});
  SCOPED_TRACE("plain, broadcast batch");
  gradcheck([](const V& x) { return F::scaled_dot_product_attention(x[0], x[1], x[2]); },
            {random_f64({2, 1, 4, 3}, g), random_f64({3, 5, 3}, g), random_f64({3, 5, 2}, g)}, {0, 1, 2});
}

// The fused node must not own its output (a reference cycle would keep every step's graph alive).
TEST(FusedAttention, GraphIsFreedWithItsOutput) {
  Generator g(2);
  std::weak_ptr<Node> fused_node;
  {
    Tensor q = random_f64({2, 6, 4}, g).set_requires_grad(true), k = random_f64({2, 6, 4}, g), v = random_f64({2, 6, 4}, g);
    Tensor y = F::scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
    // Find the node below the reshape that restores the batch dimensions.
    std::vector<std::shared_ptr<Node>> todo = {y.grad_fn()};
    while (!todo.empty() && fused_node.expired()) {
      std::shared_ptr<Node> n = todo.back();
      todo.pop_back();
      if (!n) continue;
      if (n->name() == "FusedAttentionBackward") fused_node = n;
      for (const auto& e : n->next_edges) todo.push_back(e.fn);
    }
    ASSERT_FALSE(fused_node.expired()) << "no FusedAttentionBackward in the graph";
  }
  EXPECT_TRUE(fused_node.expired()) << "the graph outlived its output";
}

TEST(FusedAttention, MasksAndDropoutTakeTheComposedPath) {
  const Tensor q = Tensor::ones({2, 3, 4}), k = Tensor::ones({2, 5, 4}), v = Tensor::ones({2, 5, 2});
  EXPECT_TRUE(F::fused_attention_path(q, k, Tensor(), 0.0));
  EXPECT_FALSE(F::fused_attention_path(q, k, F::causal_mask(3, 5), 0.0));
  EXPECT_FALSE(F::fused_attention_path(q, k, Tensor(), 0.1));
  {
    FusedSwitch off(false);
    EXPECT_FALSE(F::fused_attention_path(q, k, Tensor(), 0.0));
  }
  // Row 1 may attend to nothing: NaN there, as PyTorch; the other rows are finite.
  Tensor mask = Tensor::ones({3, 5}, kUInt8);
  for (int j = 0; j < 5; ++j) mask.data<uint8_t>()[5 + j] = 0;
  Tensor y;
  const auto calls = fused_calls([&] { y = F::scaled_dot_product_attention(q, k, v, mask); });
  EXPECT_EQ(calls.first, 0);
  const std::vector<float> out = y.to_vector<float>();
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 3; ++i) {
      for (int e = 0; e < 2; ++e) {
        const float x = out[(b * 3 + i) * 2 + e];
        EXPECT_EQ(std::isnan(x), i == 1) << "batch " << b << " row " << i;
      }
    }
  }
}

}  // namespace
