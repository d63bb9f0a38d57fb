// Autocast (nn/amp.h) through the functional ops: precision parsing, guard nesting and thread
// locality, the dtypes that flow through conv2d/linear and the f32 ops, f32 gradients on f32
// master weights, and the MNIST net's loss and gradients under bf16 against the f32 run within
// bf16 tolerance (bf16 keeps 8 significant bits: relative error ~2^-8 per rounding).
#include "nn/amp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "../common/test_util.h"
#include "core/random.h"
#include "kernels/amp.h"
#include "kernels/conv.h"
#include "nn/functional.h"
#include "nn/models/mnist_net.h"

using namespace tandem;

namespace {

Tensor rand_t(const Shape& s, Generator& gen, double lo = -1, double hi = 1) {
  std::vector<float> v(shape_numel(s));
  for (float& x : v) x = static_cast<float>(gen.uniform(lo, hi));
  return Tensor::from_vector<float>(v, s);
}

// max |a - b| / (max |b| + tiny): a relative error scaled by the tensor's magnitude.
double rel_err(const Tensor& a, const Tensor& b) {
  const auto av = a.to(kFloat64).to_vector<double>(), bv = b.to(kFloat64).to_vector<double>();
  double num = 0, den = 1e-12;
  for (size_t i = 0; i < av.size(); ++i) {
    num = std::max(num, std::abs(av[i] - bv[i]));
    den = std::max(den, std::abs(bv[i]));
  }
  return num / den;
}

double cosine(const Tensor& a, const Tensor& b) {
  const auto av = a.to(kFloat64).to_vector<double>(), bv = b.to(kFloat64).to_vector<double>();
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    ab += av[i] * bv[i];
    aa += av[i] * av[i];
    bb += bv[i] * bv[i];
  }
  return ab / std::sqrt(aa * bb + 1e-300);
}

}  // namespace

TEST(Amp, ParsePrecisionAndNames) {
  EXPECT_EQ(amp::parse_precision("off"), amp::Precision::kOff);
  EXPECT_EQ(amp::parse_precision("fp16"), amp::Precision::kFloat16);
  EXPECT_EQ(amp::parse_precision("bf16"), amp::Precision::kBFloat16);
  EXPECT_EQ(amp::precision_name(amp::Precision::kBFloat16), "bf16");
  EXPECT_EQ(amp::precision_name(amp::Precision::kFloat16), "fp16");
  EXPECT_EQ(amp::precision_name(amp::Precision::kOff), "off");
  EXPECT_EQ(amp::precision_dtype(amp::Precision::kBFloat16), kBFloat16);
  const std::string msg = test::error_of([] { amp::parse_precision("fp8"); });
  EXPECT_HAS(msg, "'fp8'");
  EXPECT_HAS(msg, "off, fp16 or bf16");
}

TEST(Amp, GuardNestsRestoresAndIsThreadLocal) {
  EXPECT_EQ(amp::autocast_precision(), amp::Precision::kOff);
  {
    amp::AutocastGuard a(amp::Precision::kBFloat16);
    EXPECT_EQ(amp::autocast_precision(), amp::Precision::kBFloat16);
    {
      amp::AutocastGuard b(amp::Precision::kOff);
      EXPECT_FALSE(amp::autocast_enabled());
    }
    EXPECT_EQ(amp::autocast_precision(), amp::Precision::kBFloat16);
    amp::Precision other = amp::Precision::kFloat16;
    std::thread t([&] { other = amp::autocast_precision(); });
    t.join();
    EXPECT_EQ(other, amp::Precision::kOff);
  }
  EXPECT_EQ(amp::autocast_precision(), amp::Precision::kOff);
}

TEST(Amp, LinearAndConvReturnLowPrecisionAndF32GradsReachMasterWeights) {
  Generator gen(3);
  for (amp::Precision p : {amp::Precision::kBFloat16, amp::Precision::kFloat16}) {
    const DType d = amp::precision_dtype(p);
    Tensor x = rand_t({2, 3, 6, 6}, gen).set_requires_grad(true);
    Tensor cw = rand_t({4, 3, 3, 3}, gen).set_requires_grad(true), cb = rand_t({4}, gen).set_requires_grad(true);
    Tensor lw = rand_t({5, 16}, gen).set_requires_grad(true), lb = rand_t({5}, gen).set_requires_grad(true);
    Tensor loss;
    {
      amp::AutocastGuard guard(p);
      Tensor h = F::conv2d(x, cw, cb, 1, 0);
      EXPECT_EQ(h.dtype(), d);
      h = F::relu(h);  // no low-precision kernel: computes in f32
      EXPECT_EQ(h.dtype(), kFloat32);
      h = F::max_pool2d(h, 2);
      h = F::flatten(h, 1);
      Tensor y = F::linear(h, lw, lb);
      EXPECT_EQ(y.dtype(), d);
      Tensor lp = F::log_softmax(y, -1);
      EXPECT_EQ(lp.dtype(), kFloat32);
      loss = F::nll_loss(lp, Tensor::from_vector<int64_t>({1, 4}, {2}));
    }
    EXPECT_EQ(loss.dtype(), kFloat32);
    loss.backward();
    for (Tensor* t : {&x, &cw, &cb, &lw, &lb}) {
      ASSERT_TRUE(t->grad().defined());
      EXPECT_EQ(t->grad().dtype(), kFloat32);
      EXPECT_EQ(t->grad().shape(), t->shape());
    }
    // Outside the guard the ordinary f32 path runs again.
    EXPECT_EQ(F::linear(rand_t({2, 16}, gen), lw, lb).dtype(), kFloat32);
  }
}

// Where the engine's f32 kernels beat oneDNN's bf16 (one input channel; 3x3 stride-1 layers with
// fewer than 16 channels and 1x1 stride-2 projections, where the direct kernels are built),
// autocast's conv2d computes in f32 on the unrounded operands and rounds only its output; elsewhere
// (3x3 stride 2 included) it computes in bf16 (the input rounded).
TEST(Amp, ConvComputesInF32OnlyWhereTheF32KernelIsFaster) {
  Generator gen(8);
  struct Case {
    int64_t cin, cout, k, stride, pad;
  };
  const kernels::Conv2dArgs s1p1{1, 1, 1, 1};
  const Tensor w8 = rand_t({8, 8, 3, 3}, gen);
  const bool direct = kernels::autocast_conv2d_in_f32(rand_t({2, 8, 6, 6}, gen), w8, s1p1);
  EXPECT_TRUE(kernels::autocast_conv2d_in_f32(rand_t({2, 1, 6, 6}, gen), rand_t({8, 1, 3, 3}, gen), {}));
  EXPECT_FALSE(kernels::autocast_conv2d_in_f32(rand_t({2, 16, 6, 6}, gen), rand_t({16, 16, 3, 3}, gen), s1p1));
  EXPECT_EQ(kernels::autocast_conv2d_in_f32(rand_t({2, 8, 6, 6}, gen), rand_t({16, 8, 1, 1}, gen),
                                            kernels::Conv2dArgs{2, 2, 0, 0}),
            direct);
  EXPECT_EQ(kernels::autocast_conv2d_in_f32(rand_t({2, 32, 6, 6}, gen), rand_t({64, 32, 1, 1}, gen),
                                            kernels::Conv2dArgs{2, 2, 0, 0}),
            direct);
  EXPECT_FALSE(kernels::autocast_conv2d_in_f32(rand_t({2, 8, 6, 6}, gen), rand_t({16, 8, 1, 1}, gen), {}));
  EXPECT_FALSE(kernels::autocast_conv2d_in_f32(rand_t({2, 8, 6, 6}, gen), rand_t({16, 8, 3, 3}, gen),
                                               kernels::Conv2dArgs{2, 2, 1, 1}));
  EXPECT_FALSE(kernels::autocast_conv2d_in_f32(rand_t({2, 8, 6, 6}, gen), w8.to(kBFloat16), s1p1));
  for (const Case c : {Case{1, 8, 3, 1, 0}, Case{8, 8, 3, 1, 1}, Case{16, 16, 3, 1, 1}, Case{8, 16, 1, 2, 0},
                       Case{8, 16, 3, 2, 1}}) {
    SCOPED_TRACE("cin " + std::to_string(c.cin) + " cout " + std::to_string(c.cout) + " k " + std::to_string(c.k));
    const Tensor x = rand_t({2, c.cin, 6, 6}, gen), w = rand_t({c.cout, c.cin, c.k, c.k}, gen), b = rand_t({c.cout}, gen);
    const kernels::Conv2dArgs args{c.stride, c.stride, c.pad, c.pad};
    Tensor y;
    {
      amp::AutocastGuard guard(amp::Precision::kBFloat16);
      y = F::conv2d(x, w, b, c.stride, c.pad);
    }
    ASSERT_EQ(y.dtype(), kBFloat16);
    const bool f32 = c.cin == 1 || (direct && (c.cout == 8 || (c.k == 1 && c.stride == 2)));
    EXPECT_EQ(kernels::autocast_conv2d_in_f32(x, w, args), f32);
    const Tensor want = f32 ? kernels::cast(kernels::conv2d_forward(x, w, b, args), kBFloat16)
                            : kernels::lowp_conv2d_forward(kernels::cast(x, kBFloat16), kernels::cast(w, kBFloat16),
                                                           kernels::cast(b, kBFloat16), args);
    EXPECT_EQ(y.to(kFloat32).to_vector<float>(), want.to(kFloat32).to_vector<float>());
  }
}

TEST(Amp, Float64IsNeverAutocast) {
  Generator gen(4);
  amp::AutocastGuard guard(amp::Precision::kBFloat16);
  const Tensor x = rand_t({2, 3}, gen).to(kFloat64), w = rand_t({4, 3}, gen).to(kFloat64);
  EXPECT_EQ(F::linear(x, w, Tensor()).dtype(), kFloat64);
}

TEST(Amp, LinearBf16MatchesF32WithinBf16Tolerance) {
  Generator gen(5);
  const Tensor x0 = rand_t({16, 32}, gen), w0 = rand_t({8, 32}, gen), b0 = rand_t({8}, gen);
  const Tensor gy = rand_t({16, 8}, gen);
  auto run = [&](amp::Precision p) {
    Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true),
           b = b0.clone().set_requires_grad(true);
    Tensor y;
    {
      amp::AutocastGuard guard(p);
      y = F::linear(x, w, b);
    }
    Tensor yf = F::relu(y);  // bf16 -> f32 at relu's entry
    F::sum(F::mul(yf, gy)).backward();
    return std::vector<Tensor>{yf, x.grad(), w.grad(), b.grad()};
  };
  const auto r32 = run(amp::Precision::kOff), r16 = run(amp::Precision::kBFloat16);
  for (size_t i = 0; i < r32.size(); ++i) {
    EXPECT_EQ(r16[i].dtype(), kFloat32) << i;
    EXPECT_LT(rel_err(r16[i], r32[i]), 0.03) << i;
  }
  EXPECT_GT(rel_err(r16[0], r32[0]), 1e-5) << "bf16 rounding must show: the low-precision path ran";
  EXPECT_GT(rel_err(r16[2], r32[2]), 1e-5);
}

// PyTorch 1.13's CPU bf16 autocast on the same net, batch and kind of input gives cosines
// 0.987 (conv1.weight) .. 0.99999 (fc2.bias) between its bf16 and f32 gradients, and max-norm
// relative errors up to 0.37 (relu masks flip), so the check is on the cosine.
TEST(Amp, MnistNetBf16LossAndGradsTrackF32) {
  manual_seed(1);
  nn::models::MnistNet net;
  net.train();
  Generator gen(6);
  const Tensor x = rand_t({8, 1, 28, 28}, gen, 0, 1);
  const Tensor target = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7}, {8});
  auto run = [&](amp::Precision p) {
    net.zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard guard(p);
      loss = F::nll_loss(net.forward(x), target);
    }
    loss.backward();
    std::vector<Tensor> grads;
    for (const Tensor& t : net.parameters()) grads.push_back(t.grad().clone());
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto [loss32, g32] = run(amp::Precision::kOff);
  const auto [loss16, g16] = run(amp::Precision::kBFloat16);
  EXPECT_NEAR(loss16, loss32, 0.02 * std::abs(loss32));
  EXPECT_NE(loss16, loss32);
  ASSERT_EQ(g16.size(), g32.size());
  const auto names = net.named_parameters();
  for (size_t i = 0; i < g32.size(); ++i) {
    EXPECT_EQ(g16[i].dtype(), kFloat32) << names[i].first;
    // A conv bias feeding BatchNorm has a zero gradient up to rounding noise: skip it.
    if (names[i].first == "conv1.bias" || names[i].first == "conv2.bias") continue;
    EXPECT_GT(cosine(g16[i], g32[i]), 0.97) << names[i].first;
  }
}
