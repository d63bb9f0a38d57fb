// Networks of the general op set on CUDA against the same networks on the CPU, through nn/ and
// autograd: composite ops whose backward chains several general kernels (var, logsumexp,
// cross_entropy with ignore_index and label smoothing, embedding with padding_idx), conv2d with
// dilation and groups (cuDNN per group), and a small GPT block (token and position embeddings,
// layer norms, causal multi-head attention, a GELU MLP, residuals, cross_entropy) forward and
// backward, every parameter gradient compared. Uses only device-neutral names, so it also compiles
// in a build without CUDA (where every test skips, or fails under TANDEM_REQUIRE_GPU=1).
//
// Tolerance: 1e-4 relative plus 1e-5 absolute (1e-4 for the convolutions, whose weight and bias
// gradients sum a few hundred signed terms, so near-zero entries carry the terms' rounding). Each
// kernel agrees with the CPU's to float32 rounding (tests/gpu/backend_ops_test.cpp holds them to
// a few float32 roundings); a network chains dozens of them, and its gradients are sums over the batch, so the
// rounding differences add up (cuDNN and cuBLAS also sum in their own order). A wrong kernel,
// index or broadcast is off by far more.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/random.h"
#include "gpu_test_util.h"
#include "nn/nn.h"

namespace {

using namespace tandem;
using namespace tandem::gpu_test;
namespace F = tandem::nn::functional;

constexpr double kRtol = 1e-4, kAtol = 1e-5;

// A leaf of x's values on `device` that requires grad.
Tensor leaf(const Tensor& x, Device device) {
  Tensor t = x.to(device).contiguous();
  if (device.is_cpu()) t = t.clone();
  t.set_requires_grad(true);
  return t;
}

// Runs fn on leaves made from inputs on the CPU and on the GPU, backward from sum(out * weights)
// (fixed random weights), and compares the outputs and every input's gradient.
template <typename Fn>
void expect_same_on_both(const std::vector<Tensor>& inputs, Fn&& fn, uint64_t seed, double atol = kAtol) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& x : inputs) {
    cpu_in.push_back(leaf(x, Device::cpu()));
    gpu_in.push_back(leaf(x, gpu()));
  }
  const Tensor y = fn(cpu_in), yd = fn(gpu_in);
  ASSERT_TRUE(yd.device().is_cuda());
  EXPECT_TRUE(close(yd, y, atol, kRtol));
  Generator gen(seed);
  const Tensor w = random_cpu(y.shape(), gen);
  F::sum(F::mul(y, w)).backward();
  F::sum(F::mul(yd, w.to(gpu()))).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_TRUE(close(gpu_in[i].grad(), cpu_in[i].grad(), atol, kRtol)) << "gradient of input " << i;
  }
}

TEST(CudaGeneralNn, CompositeOpsAndTheirGradientsMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(31);
  const Tensor x = random_cpu({4, 6, 5}, gen, -2.0, 2.0);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::var(v[0], {1}, 1.0, true); }, 1);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::logsumexp(v[0], {0, 2}); }, 2);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::gelu(F::softmax(v[0], 1), "tanh"); }, 3);
  const Tensor bias = random_cpu({5}, gen);
  expect_same_on_both({x, bias}, [](const std::vector<Tensor>& v) { return F::div(F::sigmoid(v[0]), F::add(F::exp(v[1]), 1.0)); }, 4);
  // cross_entropy over [N, C, d] with an ignored target and label smoothing.
  const Tensor target = Tensor::from_vector<int64_t>({0, 5, 2, -100, 1, 3, 4, 4, 0, 2, -100, 5}, {4, 3});
  const Tensor logits = random_cpu({4, 6, 3}, gen, -3.0, 3.0);
  std::vector<Tensor> lc = {leaf(logits, Device::cpu())}, lg = {leaf(logits, gpu())};
  const Tensor loss = F::cross_entropy(lc[0], target, -100, 0.1);
  const Tensor lossd = F::cross_entropy(lg[0], target.to(gpu()), -100, 0.1);
  EXPECT_TRUE(close(lossd, loss, kAtol, kRtol));
  loss.backward();
  lossd.backward();
  EXPECT_TRUE(close(lg[0].grad(), lc[0].grad(), kAtol, kRtol));
  // embedding with a padding index: its row gets no gradient.
  const Tensor weight = random_cpu({10, 8}, gen);
  const Tensor tokens = Tensor::from_vector<int64_t>({3, 0, 3, 9, 0, 7}, {2, 3});
  Tensor wc = leaf(weight, Device::cpu()), wg = leaf(weight, gpu());
  const Tensor e = F::embedding(tokens, wc, 0), eg = F::embedding(tokens.to(gpu()), wg, 0);
  EXPECT_TRUE(same(eg, e));
  const Tensor ew = random_cpu(e.shape(), gen);
  F::sum(F::mul(e, ew)).backward();
  F::sum(F::mul(eg, ew.to(gpu()))).backward();
  EXPECT_TRUE(close(wg.grad(), wc.grad(), kAtol, kRtol));
}

// The ops added to the general set (abs, clamp, the min family through the max kernels, var and max(x)
// with their own backward, prod, std, cumsum) on CUDA, NaN included: the CPU's values and gradients.
TEST(CudaGeneralNn, AbsClampMinVarAndNanMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(32);
  Tensor x = random_cpu({4, 6, 5}, gen, -2.0, 2.0);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::abs(v[0]); }, 5);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::clamp(v[0], -1.0, 0.5); }, 6);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::min(v[0], 1).values; }, 7);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::amin(v[0], {0, 2}, true); }, 8);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::min(v[0]); }, 9);
  EXPECT_TRUE(same(F::argmin(x.to(gpu()), 2), F::argmin(x, 2)));
  const Tensor big = F::add(random_cpu({3, 40}, gen, -1e-2, 1e-2), 1e4);  // a large mean
  expect_same_on_both({big}, [](const std::vector<Tensor>& v) { return F::var(v[0], {1}); }, 10);
  x.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::max(v[0]); }, 11);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::clamp(v[0], -1.0, std::nullopt); }, 12);
  const Tensor p = random_cpu({3, 5, 4}, gen, 0.5, 1.5);
  expect_same_on_both({p}, [](const std::vector<Tensor>& v) { return F::prod(v[0], 1); }, 13);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::std(v[0], {0, 2}, 1.0, true); }, 14);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::cumsum(v[0], 1); }, 15);
}

TEST(CudaGeneralNn, Conv2dWithDilationAndGroupsMatchesCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(32);
  struct Case {
    F::Conv2dParams p;
    int64_t C, K;
  };
  const std::vector<Case> cases = {
      {{{1, 1}, {2, 2}, {2, 2}, 1}, 3, 4},   // dilation
      {{{2, 1}, {1, 0}, {1, 1}, 2}, 4, 6},   // groups, per-axis stride and padding
      {{{1, 2}, {2, 1}, {2, 3}, 4}, 8, 8},   // depthwise-like, both
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "groups " << c.p.groups << " dilation " << c.p.dilation[0] << "x"
                                      << c.p.dilation[1]);
    const Tensor x = random_cpu({2, c.C, 11, 10}, gen);
    const Tensor w = random_cpu({c.K, c.C / c.p.groups, 3, 3}, gen), b = random_cpu({c.K}, gen);
    expect_same_on_both({x, w, b}, [&](const std::vector<Tensor>& v) { return F::conv2d(v[0], v[1], v[2], c.p); }, 5,
                        1e-4);
  }
  const Tensor x = random_cpu({2, 3, 9, 9}, gen);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::avg_pool2d(v[0], 3, 2, 1, true, false); }, 6);
  expect_same_on_both({x}, [](const std::vector<Tensor>& v) { return F::adaptive_avg_pool2d(v[0], {4, 2}); }, 7);
}

// A pre-norm GPT block with an embedding and a language-model head.
struct TinyGpt {
  static constexpr int64_t kVocab = 37, kEmbed = 32, kHeads = 4, kContext = 8;
  std::shared_ptr<nn::Embedding> tok = std::make_shared<nn::Embedding>(kVocab, kEmbed);
  std::shared_ptr<nn::Embedding> pos = std::make_shared<nn::Embedding>(kContext, kEmbed);
  std::shared_ptr<nn::LayerNorm> ln1 = std::make_shared<nn::LayerNorm>(Shape{kEmbed});
  std::shared_ptr<nn::MultiheadAttention> attn = std::make_shared<nn::MultiheadAttention>(kEmbed, kHeads);
  std::shared_ptr<nn::LayerNorm> ln2 = std::make_shared<nn::LayerNorm>(Shape{kEmbed});
  std::shared_ptr<nn::Linear> fc = std::make_shared<nn::Linear>(kEmbed, 4 * kEmbed);
  std::shared_ptr<nn::Linear> proj = std::make_shared<nn::Linear>(4 * kEmbed, kEmbed);
  std::shared_ptr<nn::LayerNorm> ln_f = std::make_shared<nn::LayerNorm>(Shape{kEmbed});
  std::shared_ptr<nn::Linear> head = std::make_shared<nn::Linear>(kEmbed, kVocab);

  std::vector<nn::Module*> modules() const {
    return {tok.get(), pos.get(), ln1.get(), attn.get(), ln2.get(), fc.get(), proj.get(), ln_f.get(), head.get()};
  }
  void to(Device d) {
    for (nn::Module* m : modules()) m->to(d);
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> out;
    for (nn::Module* m : modules())
      for (const Tensor& p : m->parameters()) out.push_back(p);
    return out;
  }
  // Mean cross-entropy of predicting next[b, t] from idx[b, :t+1].
  Tensor loss(const Tensor& idx, const Tensor& next) {
    const int64_t B = idx.size(0), T = idx.size(1);
    std::vector<int64_t> positions(T);
    for (int64_t t = 0; t < T; ++t) positions[t] = t;
    const Tensor where = Tensor::from_vector<int64_t>(positions, {T}).to(idx.device());
    Tensor h = F::add(tok->forward(idx), pos->forward(where));
    const Tensor a = ln1->forward(h);
    h = F::add(h, attn->forward(a, a, a, Tensor(), false, Tensor(), true, /*is_causal=*/true).output);
    h = F::add(h, proj->forward(F::gelu(fc->forward(ln2->forward(h)))));
    const Tensor logits = head->forward(ln_f->forward(h));
    return F::cross_entropy(F::reshape(logits, {B * T, kVocab}), F::reshape(next, {B * T}));
  }
};

TEST(CudaGeneralNn, GptBlockForwardAndBackwardMatchCpu) {
  TANDEM_NEED_GPUS(1);
  manual_seed(33);
  TinyGpt cpu_model;
  manual_seed(33);
  TinyGpt gpu_model;
  gpu_model.to(gpu());
  Generator gen(34);
  std::vector<int64_t> ids(3 * TinyGpt::kContext), next(ids.size());
  for (int64_t& v : ids) v = static_cast<int64_t>(gen.below(TinyGpt::kVocab));
  for (int64_t& v : next) v = static_cast<int64_t>(gen.below(TinyGpt::kVocab));
  const Tensor idx = Tensor::from_vector<int64_t>(ids, {3, TinyGpt::kContext});
  const Tensor tgt = Tensor::from_vector<int64_t>(next, {3, TinyGpt::kContext});
  const Tensor loss = cpu_model.loss(idx, tgt);
  const Tensor lossd = gpu_model.loss(idx.to(gpu()), tgt.to(gpu()));
  ASSERT_TRUE(lossd.device().is_cuda());
  EXPECT_TRUE(close(lossd, loss, kAtol, kRtol));
  loss.backward();
  lossd.backward();
  const std::vector<Tensor> pc = cpu_model.parameters(), pg = gpu_model.parameters();
  ASSERT_EQ(pc.size(), pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    ASSERT_TRUE(pg[i].grad().defined()) << "parameter " << i << " got no gradient on the GPU";
    EXPECT_TRUE(pg[i].grad().device().is_cuda());
    EXPECT_TRUE(close(pg[i].grad(), pc[i].grad(), kAtol, kRtol)) << "parameter " << i << " " << pc[i].str();
  }
}

}  // namespace
