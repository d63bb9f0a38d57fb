// Finite-difference gradient checks in float64 (tests/nn/gradcheck.h) for every differentiable op
// of the general set: broadcasting operands, keepdim on and off, and non-contiguous operands
// (transposed or strided views taken inside the checked function).
#include <gtest/gtest.h>

#include <optional>

#include "nn/functional.h"
#include "tests/nn/gradcheck.h"

using namespace tandem;
using tandem::testing::gradcheck;
using tandem::testing::random_f64;
using V = std::vector<Tensor>;

namespace {

// A transposed (non-contiguous) view of x, differentiably.
Tensor t01(const Tensor& x) { return F::transpose(x, 0, 1); }

}  // namespace

TEST(GradCheckOps, BroadcastingBinary) {
  Generator g(21);
  gradcheck([](const V& in) { return F::add(in[0], in[1]); }, {random_f64({4, 1, 3}, g), random_f64({5, 1}, g)}, {0, 1});
  gradcheck([](const V& in) { return F::sub(t01(in[0]), in[1]); }, {random_f64({3, 2}, g), random_f64({3}, g)}, {0, 1});
  gradcheck([](const V& in) { return F::mul(in[0], in[1]); }, {random_f64({3, 1}, g), random_f64({1, 4}, g)}, {0, 1});
  gradcheck([](const V& in) { return F::div(in[0], t01(in[1])); },
            {random_f64({2, 4, 3}, g), random_f64({3, 4}, g, 0.5, 2.0)}, {0, 1});
  gradcheck([](const V& in) { return F::pow(in[0], in[1]); }, {random_f64({3, 4}, g, 0.5, 2.0), random_f64({4}, g)},
            {0, 1});
  gradcheck([](const V& in) { return F::pow(in[0], 3.0); }, {random_f64({5}, g)}, {0});
  gradcheck([](const V& in) { return F::pow(2.0, in[0]); }, {random_f64({5}, g)}, {0});
  gradcheck([](const V& in) { return F::maximum(in[0], in[1]); }, {random_f64({3, 4}, g), random_f64({4}, g)}, {0, 1});
  gradcheck([](const V& in) { return F::minimum(in[0], in[1]); }, {random_f64({2, 1}, g), random_f64({2, 3}, g)},
            {0, 1});
  gradcheck([](const V& in) { return F::add(F::mul(in[0], 2.5), F::sub(F::div(in[0], 4.0), 1.0)); },
            {random_f64({3}, g)}, {0});
  const Tensor cond = F::gt(random_f64({3, 1, 4}, g), Tensor::scalar(0.0, kFloat64));
  gradcheck([&](const V& in) { return F::where(cond, in[0], in[1]); }, {random_f64({2, 4}, g), random_f64({3, 2, 1}, g)},
            {0, 1});
}

TEST(GradCheckOps, Unary) {
  Generator g(22);
  const std::vector<std::function<Tensor(const Tensor&)>> any_sign = {
      [](const Tensor& x) { return F::neg(x); },     [](const Tensor& x) { return F::exp(x); },
      [](const Tensor& x) { return F::tanh(x); },    [](const Tensor& x) { return F::sigmoid(x); },
      [](const Tensor& x) { return F::gelu(x); },    [](const Tensor& x) { return F::gelu(x, "tanh"); },
      [](const Tensor& x) { return F::silu(x); }};
  for (const auto& fn : any_sign) {
    gradcheck([&](const V& in) { return fn(t01(in[0])); }, {random_f64({3, 4}, g, -3.0, 3.0)}, {0});
  }
  const std::vector<std::function<Tensor(const Tensor&)>> positive = {
      [](const Tensor& x) { return F::log(x); }, [](const Tensor& x) { return F::sqrt(x); },
      [](const Tensor& x) { return F::rsqrt(x); }};
  for (const auto& fn : positive) {
    gradcheck([&](const V& in) { return fn(in[0]); }, {random_f64({2, 5}, g, 0.3, 3.0)}, {0});
  }
}

TEST(GradCheckOps, Reductions) {
  Generator g(23);
  for (bool keepdim : {false, true}) {
    gradcheck([&](const V& in) { return F::sum(in[0], {0, 2}, keepdim); }, {random_f64({2, 3, 4}, g)}, {0});
    gradcheck([&](const V& in) { return F::mean(t01(in[0]), {-1}, keepdim); }, {random_f64({4, 3}, g)}, {0});
    gradcheck([&](const V& in) { return F::var(in[0], {1}, 1.0, keepdim); }, {random_f64({3, 5}, g)}, {0});
    gradcheck([&](const V& in) { return F::var(in[0], {0, 1}, 0.0, keepdim); }, {random_f64({3, 2, 2}, g)}, {0});
    gradcheck([&](const V& in) { return F::max(t01(in[0]), 1, keepdim).values; }, {random_f64({5, 3}, g)}, {0});
    gradcheck([&](const V& in) { return F::amax(in[0], {1, 2}, keepdim); }, {random_f64({3, 2, 4}, g)}, {0});
    gradcheck([&](const V& in) { return F::logsumexp(in[0], {1}, keepdim); }, {random_f64({3, 4, 2}, g, -3, 3)}, {0});
  }
  gradcheck([](const V& in) { return F::mean(in[0]); }, {random_f64({3, 4}, g)}, {0});
  gradcheck([](const V& in) { return F::max(in[0]); }, {random_f64({3, 4}, g)}, {0});
  // A large mean: the variance's gradient 2 (x - mean) / (N - 1) must keep the noise's deviations.
  gradcheck([](const V& in) { return F::var(in[0], {1}); }, {random_f64({2, 6}, g, 1e4 - 1e-2, 1e4 + 1e-2)}, {0}, 1e-6,
            1e-3);
}

TEST(GradCheckOps, AbsClampMin) {
  Generator g(27);
  // Away from the kinks (|x| > 0.1, x not within 0.1 of a bound): a central difference there is exact.
  Tensor x = random_f64({3, 4}, g, 0.1, 2.0);
  for (int64_t i = 0; i < x.numel(); i += 2) x.data<double>()[i] *= -1.0;
  gradcheck([](const V& in) { return F::abs(t01(in[0])); }, {x.clone()}, {0});
  gradcheck([](const V& in) { return F::clamp(in[0], -1.0, 0.5); }, {x.clone()}, {0});
  gradcheck([](const V& in) { return F::clamp(t01(in[0]), std::nullopt, 0.5); }, {x.clone()}, {0});
  gradcheck([](const V& in) { return F::clamp(in[0], -1.0, std::nullopt); }, {x.clone()}, {0});
  for (bool keepdim : {false, true}) {
    gradcheck([&](const V& in) { return F::min(t01(in[0]), 1, keepdim).values; }, {random_f64({5, 3}, g)}, {0});
    gradcheck([&](const V& in) { return F::amin(in[0], {0, 2}, keepdim); }, {random_f64({3, 2, 4}, g)}, {0});
  }
  gradcheck([](const V& in) { return F::min(in[0]); }, {random_f64({3, 4}, g)}, {0});
}

TEST(GradCheckOps, ProdStdCumsum) {
  Generator g(28);
  for (bool keepdim : {false, true}) {
    gradcheck([&](const V& in) { return F::prod(t01(in[0]), 1, keepdim); }, {random_f64({4, 3}, g, 0.5, 1.5)}, {0});
    gradcheck([&](const V& in) { return F::std(in[0], {0, 2}, 1.0, keepdim); }, {random_f64({3, 2, 4}, g)}, {0});
  }
  // One zero in the input: the prefix/suffix products (the zero alone gets a gradient in its row).
  Tensor z = random_f64({3, 4}, g, 0.5, 1.5);
  z.data<double>()[5] = 0.0;
  gradcheck([](const V& in) { return F::prod(in[0], -1); }, {z}, {0});
  gradcheck([](const V& in) { return F::prod(in[0]); }, {random_f64({2, 3}, g, 0.5, 1.5)}, {0});
  gradcheck([](const V& in) { return F::std(in[0], {1}, 0.0); }, {random_f64({2, 5}, g)}, {0});
  gradcheck([](const V& in) { return F::cumsum(t01(in[0]), 1); }, {random_f64({4, 3}, g)}, {0});
  gradcheck([](const V& in) { return F::cumsum(in[0], 0); }, {random_f64({3, 2, 2}, g)}, {0});
  gradcheck([](const V& in) { return F::sort(t01(in[0]), 0, true).values; }, {random_f64({4, 3}, g)}, {0});
  gradcheck([](const V& in) { return F::topk(in[0], 2, 1, false).values; }, {random_f64({3, 5}, g)}, {0});
}

TEST(GradCheckOps, ViewsAndCopies) {
  Generator g(24);
  gradcheck([](const V& in) { return F::permute(in[0], {2, 0, 1}); }, {random_f64({2, 3, 4}, g)}, {0});
  gradcheck([](const V& in) { return F::reshape(F::transpose(in[0], 1, 2), {2, 12}); }, {random_f64({2, 3, 4}, g)},
            {0});
  gradcheck([](const V& in) { return F::view(in[0], {4, -1}); }, {random_f64({2, 3, 2}, g)}, {0});
  gradcheck([](const V& in) { return F::narrow(t01(in[0]), 1, 1, 2); }, {random_f64({4, 3}, g)}, {0});
  gradcheck([](const V& in) { return F::slice(in[0], 1, 1, 7, 2); }, {random_f64({3, 7}, g)}, {0});
  gradcheck([](const V& in) { return F::select(in[0], -1, 2); }, {random_f64({2, 4, 3}, g)}, {0});
  gradcheck([](const V& in) { return F::squeeze(F::unsqueeze(in[0], 1), 1); }, {random_f64({3, 2}, g)}, {0});
  gradcheck([](const V& in) { return F::squeeze(in[0]); }, {random_f64({3, 1, 2, 1}, g)}, {0});
  gradcheck([](const V& in) { return F::expand(in[0], {2, 3, -1}); }, {random_f64({3, 1}, g)}, {0});
  gradcheck([](const V& in) { return F::contiguous(t01(in[0])); }, {random_f64({3, 2}, g)}, {0});
  gradcheck([](const V& in) { return F::cat({in[0], t01(in[1]), in[0]}, 1); },
            {random_f64({2, 3}, g), random_f64({4, 2}, g)}, {0, 1});
  gradcheck([](const V& in) { return F::stack({in[0], in[1]}, -1); }, {random_f64({2, 3}, g), random_f64({2, 3}, g)},
            {0, 1});
  gradcheck(
      [](const V& in) {
        auto parts = F::split(in[0], {1, 3, 1}, 1);
        return F::cat({F::mul(parts[2], 3.0), parts[0], F::exp(parts[1])}, 1);
      },
      {random_f64({2, 5}, g)}, {0});
  gradcheck(
      [](const V& in) {
        auto parts = F::chunk(in[0], 2, 0);
        return F::mul(parts[0], parts[1]);
      },
      {random_f64({4, 3}, g)}, {0});
  const Tensor idx = Tensor::from_vector<int64_t>({2, 0, 2, 1}, {4});
  gradcheck([&](const V& in) { return F::index_select(t01(in[0]), 1, idx); }, {random_f64({3, 2}, g)}, {0});
  const Tensor gidx = Tensor::from_vector<int64_t>({0, 2, 2, 1, 0, 0}, {3, 2});
  gradcheck([&](const V& in) { return F::gather(in[0], 1, gidx); }, {random_f64({3, 3}, g)}, {0});
}

TEST(GradCheckOps, MatmulAndLinear) {
  Generator g(25);
  gradcheck([](const V& in) { return F::matmul(in[0], in[1]); }, {random_f64({2, 1, 3, 4}, g), random_f64({3, 4, 2}, g)},
            {0, 1});
  gradcheck([](const V& in) { return F::matmul(in[0], in[1]); }, {random_f64({4}, g), random_f64({2, 4, 3}, g)}, {0, 1});
  gradcheck([](const V& in) { return F::matmul(in[0], in[1]); }, {random_f64({2, 3, 4}, g), random_f64({4}, g)}, {0, 1});
  gradcheck([](const V& in) { return F::matmul(in[0], in[1]); }, {random_f64({4}, g), random_f64({4}, g)}, {0, 1});
  gradcheck([](const V& in) { return F::matmul(t01(in[0]), in[1]); }, {random_f64({4, 3}, g), random_f64({4, 2}, g)},
            {0, 1});
  gradcheck([](const V& in) { return F::bmm(in[0], in[1]); }, {random_f64({2, 3, 4}, g), random_f64({2, 4, 2}, g)},
            {0, 1});
  gradcheck([](const V& in) { return F::linear(in[0], in[1], in[2]); },
            {random_f64({2, 3, 4}, g), random_f64({5, 4}, g), random_f64({5}, g)}, {0, 1, 2});
  gradcheck([](const V& in) { return F::linear(in[0], in[1], Tensor()); }, {random_f64({4}, g), random_f64({2, 4}, g)},
            {0, 1});
}

TEST(GradCheckOps, SoftmaxAndLosses) {
  Generator g(26);
  for (int64_t dim : {0, 1, -1}) {
    gradcheck([&](const V& in) { return F::softmax(in[0], dim); }, {random_f64({3, 4, 2}, g, -2, 2)}, {0});
    gradcheck([&](const V& in) { return F::log_softmax(in[0], dim); }, {random_f64({3, 4, 2}, g, -2, 2)}, {0});
  }
  const Tensor target = Tensor::from_vector<int64_t>({1, -100, 3, 0, 2}, {5});
  for (const char* reduction : {"mean", "sum", "none"}) {
    for (double smoothing : {0.0, 0.15}) {
      gradcheck([&](const V& in) { return F::cross_entropy(in[0], target, -100, smoothing, reduction); },
                {random_f64({5, 4}, g, -2, 2)}, {0});
    }
  }
  const Tensor target_nd = Tensor::from_vector<int64_t>({0, 2, 1, 1, 0, 2}, {2, 3});
  gradcheck([&](const V& in) { return F::cross_entropy(in[0], target_nd, 1); }, {random_f64({2, 3, 3}, g, -2, 2)}, {0});
  gradcheck([&](const V& in) { return F::cross_entropy(in[0], Tensor::scalar(2, kInt64)); }, {random_f64({4}, g)}, {0});
  for (const char* reduction : {"mean", "sum", "none"}) {
    gradcheck([&](const V& in) { return F::mse_loss(in[0], in[1], reduction); },
              {random_f64({3, 2}, g), random_f64({3, 2}, g)}, {0, 1});
  }
}

TEST(GradCheckOps, LayerNormDropoutEmbedding) {
  Generator g(27);
  gradcheck([](const V& in) { return F::layer_norm(in[0], {3, 4}, in[1], in[2]); },
            {random_f64({2, 3, 4}, g), random_f64({3, 4}, g), random_f64({3, 4}, g)}, {0, 1, 2});
  gradcheck([](const V& in) { return F::layer_norm(t01(in[0]), {2}); }, {random_f64({2, 3}, g)}, {0});
  // dropout with a mask fixed by reseeding the generator inside fn: the gradient is mask / (1 - p).
  Generator drop(5);
  gradcheck(
      [&](const V& in) {
        drop.seed(5);
        return F::dropout(in[0], 0.3, true, drop);
      },
      {random_f64({4, 5}, g)}, {0});
  const Tensor idx = Tensor::from_vector<int64_t>({1, 3, 1, 0, 3, 3}, {2, 3});
  gradcheck([&](const V& in) { return F::embedding(idx, in[0]); }, {random_f64({4, 2}, g)}, {0});
  // padding_idx -1 (row 3): rows 0-2 get the finite-difference gradient, row 3 none at all (PyTorch's
  // rule, although the forward reads it).
  Tensor w = random_f64({4, 2}, g).set_requires_grad(true);
  Tensor plain = random_f64({4, 2}, g);
  plain.copy_(w.detach());
  plain.set_requires_grad(true);
  const Tensor r = random_f64({2, 3, 2}, g);
  F::sum(F::mul(F::embedding(idx, w, -1), r)).backward();
  F::sum(F::mul(F::embedding(idx, plain), r)).backward();
  const auto gw = w.grad().to_vector<double>(), gp = plain.grad().to_vector<double>();
  for (int i = 0; i < 6; ++i) EXPECT_DOUBLE_EQ(gw[i], gp[i]) << i;
  EXPECT_EQ(gw[6], 0.0);
  EXPECT_EQ(gw[7], 0.0);
  EXPECT_NE(gp[6], 0.0);
}

TEST(GradCheckOps, ConvolutionGeometryAndAveragePooling) {
  Generator g(28);
  gradcheck([](const V& in) { return F::conv2d(in[0], in[1], in[2], F::Conv2dParams{{2, 1}, {1, 2}, {2, 1}, 2}); },
            {random_f64({1, 4, 6, 5}, g), random_f64({4, 2, 2, 2}, g), random_f64({4}, g)}, {0, 1, 2});
  gradcheck([](const V& in) { return F::conv2d(in[0], in[1], Tensor(), F::Conv2dParams{{1, 1}, {0, 0}, {1, 1}, 3}); },
            {random_f64({3, 5, 4}, g), random_f64({3, 1, 2, 2}, g)}, {0, 1});  // unbatched, depthwise
  for (bool ceil_mode : {false, true}) {
    for (bool include_pad : {false, true}) {
      gradcheck([&](const V& in) { return F::avg_pool2d(in[0], 3, 2, 1, ceil_mode, include_pad); },
                {random_f64({1, 2, 6, 5}, g)}, {0});
    }
  }
  gradcheck([](const V& in) { return F::adaptive_avg_pool2d(F::transpose(in[0], 2, 3), {3, 2}); },
            {random_f64({2, 1, 4, 7}, g)}, {0});
  gradcheck([](const V& in) { return F::avg_pool2d(in[0], 3, 2, 1, true, false, 4); }, {random_f64({1, 2, 6, 5}, g)},
            {0});
  gradcheck([](const V& in) { return F::max_pool2d(in[0], 2, 2, 1, 2, true); }, {random_f64({1, 2, 7, 6}, g)}, {0});
  gradcheck([](const V& in) { return F::adaptive_max_pool2d(in[0], {3, 2}); }, {random_f64({2, 5, 7}, g)}, {0});
}
