// batch_norm on CUDA against the CPU kernel: training (output, saved statistics, running
// statistics updated with momentum and the unbiased variance), eval, 4-D and 2-D inputs, affine
// or not, without running statistics, strided input, and all backward gradients in both modes.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/batch_norm.h"

// The cuda:: kernels exist only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
namespace kc = tandem::kernels::cuda;
namespace kp = tandem::kernels::cpu;

namespace {

constexpr double kAtol = 1e-4, kRtol = 1e-4;

Tensor maybe_gpu(const Tensor& t) { return t.defined() ? t.to(gpu()) : Tensor(); }

struct Setup {
  Tensor x, weight, bias, running_mean, running_var;
};

Setup make(const Shape& shape, bool affine, bool running, Generator& gen) {
  Setup s;
  // An offset and a scale per tensor so mean and variance are far from 0 and 1.
  s.x = random_cpu(shape, gen, 2.0, 5.0);
  const int64_t C = shape[1];
  if (affine) {
    s.weight = random_cpu({C}, gen, 0.5, 1.5);
    s.bias = random_cpu({C}, gen, -0.5, 0.5);
  }
  if (running) {
    s.running_mean = random_cpu({C}, gen, -0.2, 0.2);
    s.running_var = random_cpu({C}, gen, 0.5, 2.0);
  }
  return s;
}

void check(const Shape& shape, bool affine, bool running, bool training, uint64_t seed, bool strided = false) {
  SCOPED_TRACE(::testing::Message() << shape_str(shape) << " affine " << affine << " running " << running
                                    << " training " << training << " strided " << strided);
  Generator gen(seed);
  const Setup cpu = make(shape, affine, running, gen);
  Setup dev{maybe_gpu(cpu.x), maybe_gpu(cpu.weight), maybe_gpu(cpu.bias), maybe_gpu(cpu.running_mean),
            maybe_gpu(cpu.running_var)};
  Tensor x_cpu = cpu.x;
  if (strided) {  // the same values through a transposed view, on both sides
    x_cpu = cpu.x.transpose(0, 1).contiguous().transpose(0, 1);
    dev.x = cpu.x.transpose(0, 1).contiguous().to(gpu()).transpose(0, 1);
    ASSERT_FALSE(dev.x.is_contiguous());
  }
  const double momentum = 0.1, eps = 1e-5;
  const kernels::BatchNormForward ref = kp::batch_norm_forward(x_cpu, cpu.weight, cpu.bias, cpu.running_mean,
                                                               cpu.running_var, training, momentum, eps);
  const kernels::BatchNormForward got = kc::batch_norm_forward(dev.x, dev.weight, dev.bias, dev.running_mean,
                                                               dev.running_var, training, momentum, eps);
  EXPECT_TRUE(close(got.output, ref.output, kAtol, kRtol));
  EXPECT_TRUE(close(got.save_mean, ref.save_mean, kAtol, kRtol));
  EXPECT_TRUE(close(got.save_invstd, ref.save_invstd, kAtol, kRtol));
  if (running) {  // updated in place on both sides (or left alone in eval)
    EXPECT_TRUE(close(dev.running_mean, cpu.running_mean, 1e-6, 1e-5));
    EXPECT_TRUE(close(dev.running_var, cpu.running_var, 1e-6, 1e-5));
  }

  const Tensor dy = random_cpu(shape, gen);
  const kernels::BatchNormGrads gref =
      kp::batch_norm_backward(dy, x_cpu, cpu.weight, ref.save_mean, ref.save_invstd, training, true, affine, affine);
  const kernels::BatchNormGrads ggot = kc::batch_norm_backward(dy.to(gpu()), dev.x, dev.weight, got.save_mean,
                                                               got.save_invstd, training, true, affine, affine);
  EXPECT_TRUE(close(ggot.input, gref.input, kAtol, kRtol));
  if (affine) {
    EXPECT_TRUE(close(ggot.weight, gref.weight, 1e-3, kRtol));
    EXPECT_TRUE(close(ggot.bias, gref.bias, 1e-3, kRtol));
  } else {
    EXPECT_FALSE(ggot.weight.defined());
    EXPECT_FALSE(ggot.bias.defined());
  }
}

}  // namespace

TEST(CudaBatchNorm, Training4d) {
  TANDEM_NEED_GPUS(1);
  check({4, 3, 5, 6}, true, true, true, 1);
  check({16, 32, 26, 26}, true, true, true, 2);  // the MNIST net's first BatchNorm2d
}

TEST(CudaBatchNorm, Training2dAffineOrNotWithOrWithoutRunningStats) {
  TANDEM_NEED_GPUS(1);
  check({8, 5}, true, true, true, 3);
  check({8, 5}, false, true, true, 4);
  check({8, 5}, true, false, true, 5);
  check({6, 4, 3}, false, false, true, 6);
}

// Each channel's values split over several blocks (kernels/cuda/batch_norm.cu's parts): many rows with few
// channels, a spatial size that does not divide the block (the (n, s) walk wraps unevenly), and S = 1.
TEST(CudaBatchNorm, ManyValuesPerChannelSplitOverBlocks) {
  TANDEM_NEED_GPUS(1);
  check({5000, 3}, true, true, true, 10);
  check({300, 2, 7}, true, true, true, 11);
  check({64, 4, 33, 31}, false, true, true, 12);
}

TEST(CudaBatchNorm, Eval) {
  TANDEM_NEED_GPUS(1);
  check({4, 3, 5, 6}, true, true, false, 7);
  check({8, 5}, false, true, false, 8);
}

TEST(CudaBatchNorm, StridedInput) {
  TANDEM_NEED_GPUS(1);
  check({4, 3, 5, 6}, true, true, true, 9, true);
}

TEST(CudaBatchNorm, RunningVarUsesTheUnbiasedVariance) {
  TANDEM_NEED_GPUS(1);
  // One channel holding 1, 2, 3, 4: mean 2.5, biased variance 1.25, unbiased 5/3.
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {4, 1}).to(gpu());
  Tensor rm = Tensor::zeros({1}, kFloat32, gpu()), rv = Tensor::ones({1}, kFloat32, gpu());
  const kernels::BatchNormForward f = kc::batch_norm_forward(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5);
  EXPECT_NEAR(rm.item<float>(), 0.25, 1e-6);
  EXPECT_NEAR(rv.item<float>(), 0.9 + 0.1 * (5.0 / 3.0), 1e-6);
  EXPECT_NEAR(f.save_invstd.item<float>(), 1.0 / std::sqrt(1.25 + 1e-5), 1e-6);
}

TEST(CudaBatchNorm, TrainingNeedsMoreThanOneValuePerChannel) {
  TANDEM_NEED_GPUS(1);
  const Tensor x = Tensor::zeros({1, 3}, kFloat32, gpu());
  EXPECT_TRUE(throws_with([&] { kc::batch_norm_forward(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5); },
                          {"more than 1 value per channel"}));
}

#endif  // TANDEM_WITH_CUDA
