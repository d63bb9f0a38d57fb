// conv2d on CUDA (cuDNN + bias kernels) against the CPU kernel: forward with and without bias,
// the three backward gradients, strides and padding, the MNIST net's two layer shapes, strided
// inputs, repeatability of the cached algorithms, and the float32-only error.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/conv.h"

// The cuda:: kernels exist only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
namespace kc = tandem::kernels::cuda;
namespace kp = tandem::kernels::cpu;

namespace {

struct Case {
  int64_t N, C, H, W, K, R, S;
  kernels::Conv2dArgs args;
  bool bias;
};

void check_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "N" << c.N << " C" << c.C << " " << c.H << "x" << c.W << " K" << c.K << " "
                                    << c.R << "x" << c.S << " stride " << c.args.stride_h << "," << c.args.stride_w
                                    << " pad " << c.args.pad_h << "," << c.args.pad_w << " bias " << c.bias);
  Generator gen(seed);
  const Tensor x = random_cpu({c.N, c.C, c.H, c.W}, gen);
  const Tensor w = random_cpu({c.K, c.C, c.R, c.S}, gen, -0.3, 0.3);
  const Tensor b = c.bias ? random_cpu({c.K}, gen) : Tensor();
  const Tensor y_ref = kp::conv2d_forward(x, w, b, c.args);
  const Tensor y = kc::conv2d_forward(x.to(gpu()), w.to(gpu()), c.bias ? b.to(gpu()) : Tensor(), c.args);
  EXPECT_TRUE(y.device().is_cuda());
  ASSERT_TRUE(close(y, y_ref, 1e-4, 1e-4));

  const Tensor dy = random_cpu(y_ref.shape(), gen);
  const kernels::Conv2dGrads ref = kp::conv2d_backward(dy, x, w, c.args, true, true, c.bias);
  const kernels::Conv2dGrads got = kc::conv2d_backward(dy.to(gpu()), x.to(gpu()), w.to(gpu()), c.args, true, true,
                                                       c.bias);
  EXPECT_TRUE(close(got.input, ref.input, 1e-4, 1e-4));
  // The weight and bias gradients sum over N * P * Q products: allow for the summation order.
  EXPECT_TRUE(close(got.weight, ref.weight, 1e-3, 1e-4));
  if (c.bias) {
    EXPECT_TRUE(close(got.bias, ref.bias, 1e-3, 1e-4));
  } else {
    EXPECT_FALSE(got.bias.defined());
  }
}

}  // namespace

TEST(CudaConv2d, MatchesCpuAcrossShapes) {
  TANDEM_NEED_GPUS(1);
  const Case cases[] = {
      {2, 3, 9, 8, 4, 3, 3, {1, 1, 0, 0}, true},
      {2, 3, 9, 8, 4, 3, 3, {1, 1, 0, 0}, false},
      {3, 2, 11, 10, 5, 3, 2, {2, 2, 1, 1}, true},
      {1, 4, 7, 7, 3, 5, 5, {2, 1, 2, 0}, true},
      {2, 3, 6, 9, 2, 1, 1, {1, 2, 0, 0}, true},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) check_case(c, seed++);
}

TEST(CudaConv2d, MatchesCpuOnTheMnistLayers) {
  TANDEM_NEED_GPUS(1);
  check_case({8, 1, 28, 28, 32, 3, 3, {1, 1, 0, 0}, true}, 200);   // conv1
  check_case({8, 32, 13, 13, 64, 3, 3, {1, 1, 0, 0}, true}, 201);  // conv2
}

TEST(CudaConv2d, OnlyTheRequestedGradients) {
  TANDEM_NEED_GPUS(1);
  Generator gen(300);
  const Tensor x = random_cpu({2, 3, 8, 8}, gen), w = random_cpu({4, 3, 3, 3}, gen), dy = random_cpu({2, 4, 6, 6}, gen);
  const kernels::Conv2dArgs args;
  const kernels::Conv2dGrads ref = kp::conv2d_backward(dy, x, w, args, false, true, false);
  const kernels::Conv2dGrads got =
      kc::conv2d_backward(dy.to(gpu()), x.to(gpu()), w.to(gpu()), args, false, true, false);
  EXPECT_FALSE(got.input.defined());
  EXPECT_FALSE(got.bias.defined());
  EXPECT_TRUE(close(got.weight, ref.weight, 1e-3, 1e-4));
}

TEST(CudaConv2d, StridedInputs) {
  TANDEM_NEED_GPUS(1);
  Generator gen(301);
  // x stored as [N, C, W, H] and viewed as [N, C, H, W], on the host and on the device
  const Tensor stored = random_cpu({2, 3, 7, 9}, gen);
  const Tensor x = stored.transpose(2, 3);
  const Tensor x_dev = stored.to(gpu()).transpose(2, 3);
  ASSERT_FALSE(x_dev.is_contiguous());
  const Tensor w = random_cpu({4, 3, 3, 3}, gen);
  const Tensor b = random_cpu({4}, gen);
  const kernels::Conv2dArgs args{1, 1, 1, 1};
  const Tensor y_ref = kp::conv2d_forward(x, w, b, args);
  EXPECT_TRUE(close(kc::conv2d_forward(x_dev, w.to(gpu()), b.to(gpu()), args), y_ref, 1e-4, 1e-4));
  const Tensor dy_stored = random_cpu({y_ref.size(1), y_ref.size(0), y_ref.size(2), y_ref.size(3)}, gen);
  const Tensor dy = dy_stored.transpose(0, 1);
  const Tensor dy_dev = dy_stored.to(gpu()).transpose(0, 1);
  const kernels::Conv2dGrads ref = kp::conv2d_backward(dy, x, w, args, true, true, true);
  const kernels::Conv2dGrads got = kc::conv2d_backward(dy_dev, x_dev, w.to(gpu()), args, true, true, true);
  EXPECT_TRUE(close(got.input, ref.input, 1e-4, 1e-4));
  EXPECT_TRUE(close(got.weight, ref.weight, 1e-3, 1e-4));
  EXPECT_TRUE(close(got.bias, ref.bias, 1e-3, 1e-4));
}

TEST(CudaConv2d, RepeatedCallsGiveIdenticalResults) {
  TANDEM_NEED_GPUS(1);
  Generator gen(302);
  const Tensor x = random_cpu({4, 8, 12, 12}, gen).to(gpu());
  const Tensor w = random_cpu({16, 8, 3, 3}, gen).to(gpu());
  const Tensor dy = random_cpu({4, 16, 10, 10}, gen).to(gpu());
  const kernels::Conv2dArgs args;
  const Tensor y1 = kc::conv2d_forward(x, w, Tensor(), args);
  const Tensor y2 = kc::conv2d_forward(x, w, Tensor(), args);  // cached algorithm
  EXPECT_TRUE(same(y1, y2));
  const kernels::Conv2dGrads g1 = kc::conv2d_backward(dy, x, w, args, true, true, false);
  const kernels::Conv2dGrads g2 = kc::conv2d_backward(dy, x, w, args, true, true, false);
  EXPECT_TRUE(same(g1.input, g2.input));
  EXPECT_TRUE(same(g1.weight, g2.weight));  // a deterministic algorithm was preferred
}

TEST(CudaConv2d, RejectsOtherDtypesAndBadShapes) {
  TANDEM_NEED_GPUS(1);
  const Tensor x64 = Tensor::zeros({1, 1, 5, 5}, kFloat64, gpu());
  const Tensor w64 = Tensor::zeros({1, 1, 3, 3}, kFloat64, gpu());
  EXPECT_TRUE(throws_with([&] { kc::conv2d_forward(x64, w64, Tensor(), {}); }, {"conv2d_forward", "float32"}));
  const Tensor x = Tensor::zeros({1, 2, 5, 5}, kFloat32, gpu());
  const Tensor w = Tensor::zeros({1, 3, 3, 3}, kFloat32, gpu());
  EXPECT_TRUE(throws_with([&] { kc::conv2d_forward(x, w, Tensor(), {}); }, {"conv2d_forward", "input channels"}));
}

#endif  // TANDEM_WITH_CUDA
