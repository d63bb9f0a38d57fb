// Mixed precision on CUDA against the CPU reference: the f16/bf16 paths of the cuDNN conv and the
// cuBLAS (cublasGemmEx, float compute) linear against the CPU emulation (f32 math on the same
// rounded operands, rounded result), the GradScaler with CUDA gradients (the casts and the fused
// unscale + non-finite check are table ops: tests/gpu/backend_ops_test.cpp), and an autocast
// forward/backward of the MNIST net on both devices. Skips cleanly where no CUDA device is visible.
// Tolerance: the two sides round to the storage dtype at different points (cuDNN/cuBLAS round the
// product and then the bias add; the CPU rounds once) and sum in different orders, so results may
// differ by a couple of units in the last place of the dtype: |diff| <= rel * (max|ref| + |ref|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/cuda/graph.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/amp.h"

#ifndef TANDEM_WITH_CUDA
TEST(GpuGraph, BuiltWithoutCudaSaysSo) {
  EXPECT_FALSE(tandem::cuda::Graph::supported());
  EXPECT_TRUE(tandem::gpu_test::throws_with([] { tandem::cuda::Graph g(0); }, {"built without CUDA"}));
}
#endif

#ifdef TANDEM_WITH_CUDA

#include "nn/amp.h"
#include "nn/functional.h"
#include "nn/models/mnist_net.h"
#include "optim/grad_scaler.h"

using namespace tandem;
using namespace tandem::gpu_test;

namespace {

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : as_doubles(t)) m = std::max(m, std::abs(v));
  return m;
}

// Two units in the last place of dtype d, relative.
double ulps2(DType d) { return d == kBFloat16 ? 2 * 0x1p-8 : 2 * 0x1p-11; }

::testing::AssertionResult close_lowp(const Tensor& got, const Tensor& ref, DType d) {
  if (got.defined() && got.dtype() != d)
    return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype()) << ", expected " << dtype_name(d);
  const double rel = ulps2(d);
  return close(got, ref, rel * max_abs(ref), rel);
}

Tensor lowp_cpu(const Shape& s, Generator& gen, DType d, double lo = -1, double hi = 1) {
  return kernels::cast(random_cpu(s, gen, lo, hi), d);
}

Tensor on_gpu(const Tensor& t) { return t.defined() ? t.to(gpu()) : Tensor(); }

}  // namespace

TEST(GpuAmp, LinearHalfTypesMatchCpuEmulation) {
  TANDEM_NEED_GPUS(1);
  Generator gen(21);
  for (DType d : {kBFloat16, kFloat16}) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << " bias " << bias);
      const Tensor x = lowp_cpu({64, 1600}, gen, d), w = lowp_cpu({128, 1600}, gen, d, -0.05, 0.05);
      const Tensor b = bias ? lowp_cpu({128}, gen, d) : Tensor();
      EXPECT_TRUE(close_lowp(kernels::lowp_linear_forward(on_gpu(x), on_gpu(w), on_gpu(b)),
                             kernels::lowp_linear_forward(x, w, b), d));
      const Tensor dy = lowp_cpu({64, 128}, gen, d);
      const auto ref = kernels::lowp_linear_backward(dy, x, w, true, true, bias);
      const auto got = kernels::lowp_linear_backward(on_gpu(dy), on_gpu(x), on_gpu(w), true, true, bias);
      EXPECT_TRUE(close_lowp(got.input, ref.input, d));
      EXPECT_TRUE(close_lowp(got.weight, ref.weight, d));
      if (bias) {
        EXPECT_TRUE(close_lowp(got.bias, ref.bias, d));
      }
    }
  }
}

TEST(GpuAmp, Conv2dHalfTypesMatchCpuEmulation) {
  TANDEM_NEED_GPUS(1);
  Generator gen(22);
  for (DType d : {kBFloat16, kFloat16}) {
    for (const kernels::Conv2dArgs args : {kernels::Conv2dArgs{1, 1, 0, 0}, kernels::Conv2dArgs{2, 2, 1, 1}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << " stride " << args.stride_h);
      const Tensor x = lowp_cpu({8, 32, 13, 13}, gen, d), w = lowp_cpu({64, 32, 3, 3}, gen, d, -0.1, 0.1);
      const Tensor b = lowp_cpu({64}, gen, d);
      const Tensor y_ref = kernels::lowp_conv2d_forward(x, w, b, args);
      EXPECT_TRUE(close_lowp(kernels::lowp_conv2d_forward(on_gpu(x), on_gpu(w), on_gpu(b), args), y_ref, d));
      const Tensor dy = lowp_cpu(y_ref.shape(), gen, d);
      const auto ref = kernels::lowp_conv2d_backward(dy, x, w, args, true, true, true);
      const auto got = kernels::lowp_conv2d_backward(on_gpu(dy), on_gpu(x), on_gpu(w), args, true, true, true);
      EXPECT_TRUE(close_lowp(got.input, ref.input, d));
      EXPECT_TRUE(close_lowp(got.weight, ref.weight, d));
      EXPECT_TRUE(close_lowp(got.bias, ref.bias, d));
    }
  }
}

TEST(GpuAmp, GradScalerSkipsOnInfWithCudaGrads) {
  TANDEM_NEED_GPUS(1);
  Tensor p = Tensor::from_vector<float>({1.0f, 2.0f}, {2}).to(gpu()).set_requires_grad(true);
  optim::SGD opt({p}, optim::SGDOptions{.lr = 1.0});
  optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 4.0});
  p.set_grad(Tensor::from_vector<float>({4.0f, 8.0f}, {2}).to(gpu()));
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
  p.set_grad(Tensor::from_vector<float>({std::numeric_limits<float>::infinity(), 8.0f}, {2}).to(gpu()));
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
}

TEST(GpuAmp, MnistNetAutocastMatchesCpuAutocast) {
  TANDEM_NEED_GPUS(1);
  for (amp::Precision p : {amp::Precision::kBFloat16, amp::Precision::kFloat16}) {
    SCOPED_TRACE(amp::precision_name(p));
    manual_seed(5);
    nn::models::MnistNet cpu_net, gpu_net;
    std::map<std::string, Tensor> state;
    for (const auto& [name, t] : cpu_net.state_dict()) state[name] = t;
    gpu_net.load_state_dict(state);
    gpu_net.to(gpu());
    Generator gen(25);
    const Tensor x = random_cpu({16, 1, 28, 28}, gen, 0, 1);
    const Tensor target = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}, {16});
    auto run = [&](nn::Module& net, const Tensor& xi, const Tensor& ti) {
      Tensor loss;
      {
        amp::AutocastGuard guard(p);
        loss = F::nll_loss(net.forward(xi), ti);
      }
      loss.backward();
      return loss.item<double>();
    };
    const double l_cpu = run(cpu_net, x, target), l_gpu = run(gpu_net, x.to(gpu()), target.to(gpu()));
    EXPECT_NEAR(l_gpu, l_cpu, 0.01 * std::abs(l_cpu));
    const auto pc = cpu_net.named_parameters(), pg = gpu_net.named_parameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      if (pc[i].first == "conv1.bias" || pc[i].first == "conv2.bias") continue;  // ~0 before BatchNorm
      const Tensor gc = pc[i].second.grad(), gg = pg[i].second.grad();
      ASSERT_EQ(gg.dtype(), kFloat32) << pc[i].first;
      const auto a = as_doubles(gc), b = as_doubles(gg);
      double ab = 0, aa = 0, bb = 0;
      for (size_t j = 0; j < a.size(); ++j) {
        ab += a[j] * b[j];
        aa += a[j] * a[j];
        bb += b[j] * b[j];
      }
      EXPECT_GT(ab / std::sqrt(aa * bb + 1e-300), 0.97) << pc[i].first;
    }
  }
}

// The --cuda-graph building block: capture one queued kernel, replay it three times.
TEST(GpuGraph, CaptureAndReplayAKernel) {
  TANDEM_NEED_GPUS(1);
  EXPECT_TRUE(tandem::cuda::Graph::supported());
  Tensor g = Tensor::from_vector<float>({8.0f, -16.0f, 1.0f}, {3}).to(gpu());
  Tensor flag = Tensor::zeros({1}, kFloat32, gpu());
  tandem::cuda::Graph graph(0);
  graph.begin_capture();
  kernels::unscale_and_check_(g, flag, 0.5);  // recorded, not run
  graph.end_capture();
  EXPECT_TRUE(graph.captured());
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{8.0f, -16.0f, 1.0f}));
  for (int i = 0; i < 3; ++i) graph.replay();
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{1.0f, -2.0f, 0.125f}));
  EXPECT_EQ(flag.item<float>(), 0.0f);
  graph.reset();
  EXPECT_FALSE(graph.captured());
  EXPECT_TRUE(throws_with([&] { graph.replay(); }, {"nothing captured"}));
}

#endif  // TANDEM_WITH_CUDA
