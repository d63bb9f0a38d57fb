// The fused max_pool2d(relu(batch_norm(x)), 2) through nn: F::batch_norm_relu_max_pool2d and its
// autograd node against the unfused ops (output bitwise, gradients of x, weight and bias within
// float rounding), the float64 fallback (exactly the unfused ops), BatchNorm2d::forward_relu_pool2
// (counts the batch; with synced statistics installed it goes through the sync strategy; eval is
// fused and does not count), and MnistNet's training step (log-probabilities and running
// statistics bitwise those of the unfused composition, every parameter gradient within rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "core/autograd.h"
#include "core/random.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/models/mnist_net.h"

using namespace tandem;

namespace {

Tensor random_t(const Shape& shape, Generator& gen, double lo, double hi, DType dtype = kFloat32) {
  std::vector<double> v(shape_numel(shape));
  for (double& e : v) e = gen.uniform(lo, hi);
  return Tensor::from_vector<double>(v, shape).to(dtype);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

// max |a - b| / (1 + max |b|): float rounding of sums taken in another order stays far below 1e-4.
double max_rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to(kFloat64).to_vector<double>(), vb = b.to(kFloat64).to_vector<double>();
  EXPECT_EQ(va.size(), vb.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return diff / (1 + scale);
}

// Records the calls and computes plain batch_norm (stands in for dist::SyncBatchNormStats).
struct CountingSync final : nn::BatchNormStatsSync {
  int calls = 0;
  Tensor forward(nn::BatchNorm2d& bn, const Tensor& x) override {
    ++calls;
    return F::batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, true, bn.momentum, bn.eps);
  }
  std::string name() const override { return "CountingSync"; }
};

// Output and the gradients of x, weight, bias for loss = sum(out * gy).
std::vector<Tensor> run_op(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& rm,
                           const Tensor& rv, const Tensor& gy, bool training, bool fused) {
  Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true),
         b = b0.clone().set_requires_grad(true);
  const Tensor y = fused ? F::batch_norm_relu_max_pool2d(x, rm, rv, w, b, training)
                         : F::max_pool2d(F::batch_norm_relu(x, rm, rv, w, b, training), 2);
  F::sum(F::mul(y, gy)).backward();
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

}  // namespace

TEST(BatchNormReluPoolOp, MatchesTheUnfusedOpsWithAutograd) {
  Generator gen(10);
  for (const Shape& shape : {Shape{6, 4, 26, 26}, Shape{5, 3, 11, 11}, Shape{1, 2, 7, 4}}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(shape_str(shape) + (training ? " train" : " eval"));
      const int64_t C = shape[1];
      const Tensor x = random_t(shape, gen, -2, 2), w = random_t({C}, gen, 0.5, 1.5),
                   b = random_t({C}, gen, -0.5, 0.5);
      const Tensor gy = random_t({shape[0], C, shape[2] / 2, shape[3] / 2}, gen, -1, 1);
      const Tensor rm0 = random_t({C}, gen, -0.2, 0.2), rv0 = random_t({C}, gen, 0.5, 2);
      Tensor rm_a = rm0.clone(), rv_a = rv0.clone(), rm_b = rm0.clone(), rv_b = rv0.clone();
      const auto a = run_op(x, w, b, rm_a, rv_a, gy, training, /*fused=*/true);
      const auto r = run_op(x, w, b, rm_b, rv_b, gy, training, /*fused=*/false);
      EXPECT_TRUE(same_bits(a[0], r[0])) << "output";
      EXPECT_TRUE(same_bits(rm_a, rm_b) && same_bits(rv_a, rv_b)) << "running statistics";
      for (size_t i = 1; i < a.size(); ++i) EXPECT_LT(max_rel_diff(a[i], r[i]), 1e-5) << "gradient " << i;
      EXPECT_GT(max_rel_diff(a[1], Tensor::zeros(shape)), 1e-3) << "a gradient reached x";
    }
  }
}

TEST(BatchNormReluPoolOp, Float64FallsBackToTheUnfusedOps) {
  Generator gen(11);
  const Tensor x = random_t({3, 2, 6, 7}, gen, -2, 2, kFloat64), w = random_t({2}, gen, 0.5, 1.5, kFloat64),
               b = random_t({2}, gen, -0.5, 0.5, kFloat64), gy = random_t({3, 2, 3, 3}, gen, -1, 1, kFloat64);
  const auto a = run_op(x, w, b, Tensor(), Tensor(), gy, true, true);
  const auto r = run_op(x, w, b, Tensor(), Tensor(), gy, true, false);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], r[i])) << i;
}

TEST(BatchNormReluPoolOp, ModuleCountsTheBatchAndHonoursSyncedStatistics) {
  Generator gen(12);
  const Tensor x = random_t({3, 2, 6, 6}, gen, -2, 2);
  nn::BatchNorm2d a(2), b(2);
  const Tensor ya = a.forward_relu_pool2(x);
  const Tensor yb = F::max_pool2d(b.forward_relu(x), 2);
  EXPECT_TRUE(same_bits(ya, yb));
  EXPECT_TRUE(same_bits(a.running_mean, b.running_mean) && same_bits(a.running_var, b.running_var));
  EXPECT_EQ(a.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{1});
  a.eval();
  b.eval();
  EXPECT_TRUE(same_bits(a.forward_relu_pool2(x), F::max_pool2d(b.forward_relu(x), 2)));
  EXPECT_EQ(a.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{1});  // eval does not count

  nn::BatchNorm2d s(2);
  auto sync = std::make_shared<CountingSync>();
  s.set_stats_sync(sync);
  const Tensor ys = s.forward_relu_pool2(x);
  EXPECT_EQ(sync->calls, 1);
  EXPECT_EQ(s.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{1});
  EXPECT_EQ(ys.shape(), (Shape{3, 2, 3, 3}));
  EXPECT_LT(max_rel_diff(ys, ya), 1e-6);  // plain batch_norm statistics either way
  s.eval();                               // eval never syncs: fused
  s.forward_relu_pool2(x);
  EXPECT_EQ(sync->calls, 1);
}

TEST(BatchNormReluPoolOp, MnistNetStepMatchesTheUnfusedComposition) {
  manual_seed(3);
  nn::models::MnistNet fused_net, plain_net;
  fused_net.train();
  plain_net.train();
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : fused_net.state_dict()) state[name] = t.clone();
  plain_net.load_state_dict(state);
  Generator gen(13);
  const Tensor x = random_t({16, 1, 28, 28}, gen, 0, 1);
  std::vector<int64_t> labels;
  for (int i = 0; i < 16; ++i) labels.push_back(i % 10);
  const Tensor target = Tensor::from_vector<int64_t>(labels, {16});

  const Tensor out_fused = fused_net.forward(x);
  F::nll_loss(out_fused, target).backward();
  // The same modules, op by op as before the fusion.
  nn::models::MnistNet& p = plain_net;
  Tensor h = (*p.conv1)(x);
  h = F::max_pool2d(p.n1->forward_relu(h), 2);
  h = (*p.conv2)(h);
  h = F::max_pool2d(p.n2->forward_relu(h), 2);
  h = F::relu((*p.fc1)(F::flatten(h, 1)));
  const Tensor out_plain = F::log_softmax((*p.fc2)(h), -1);
  F::nll_loss(out_plain, target).backward();

  EXPECT_TRUE(same_bits(out_fused.detach(), out_plain.detach())) << "log-probabilities";
  const auto bf = fused_net.named_buffers(), bp = plain_net.named_buffers();
  ASSERT_EQ(bf.size(), bp.size());
  for (size_t i = 0; i < bf.size(); ++i) EXPECT_TRUE(same_bits(bf[i].second, bp[i].second)) << bf[i].first;
  const auto pf = fused_net.named_parameters(), pp = plain_net.named_parameters();
  ASSERT_EQ(pf.size(), pp.size());
  for (size_t i = 0; i < pf.size(); ++i) {
    ASSERT_TRUE(pf[i].second.grad().defined()) << pf[i].first;
    // conv biases feed BatchNorm: their gradients are rounding noise around 0 (1 + max keeps it absolute).
    EXPECT_LT(max_rel_diff(pf[i].second.grad(), pp[i].second.grad()), 1e-5) << pf[i].first;
  }
}

// num_batches_tracked counts every training forward (plain, relu, relu + pool) by an in-place add
// on the buffer itself: the same storage, the count in state_dict, nothing counted in eval.
TEST(BatchNormReluPoolOp, BatchCounterAddsInPlaceOnTheBuffer) {
  Generator gen(13);
  const Tensor x = random_t({2, 3, 4, 4}, gen, -1, 1);
  nn::BatchNorm2d bn(3);
  const void* storage = bn.num_batches_tracked.raw_data();
  bn.forward(x);
  bn.forward_relu(x);
  bn.forward_relu_pool2(x);
  EXPECT_EQ(bn.num_batches_tracked.raw_data(), storage);
  EXPECT_EQ(bn.num_batches_tracked.dtype(), kInt64);
  EXPECT_EQ(bn.num_batches_tracked.to_vector<int64_t>(), std::vector<int64_t>{3});
  bn.eval();
  bn.forward(x);
  int found = 0;
  for (const auto& [name, t] : bn.state_dict()) {
    if (name != "num_batches_tracked") continue;
    ++found;
    EXPECT_EQ(t.to_vector<int64_t>(), std::vector<int64_t>{3});
  }
  EXPECT_EQ(found, 1);
}
