// Fused optimizer updates on CUDA against the CPU kernels: several steps of SGD (plain, momentum,
// nesterov, weight decay), Adadelta and Adam/AdamW from the same start, comparing parameters and
// optimizer state after each step; a strided gradient; the float32-only error.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/optim.h"

// The cuda:: kernels exist only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
namespace kc = tandem::kernels::cuda;
namespace kp = tandem::kernels::cpu;

namespace {

constexpr double kAtol = 1e-6, kRtol = 1e-5;
const Shape kShape{37, 29};

}  // namespace

TEST(CudaOptim, SgdMatchesCpu) {
  TANDEM_NEED_GPUS(1);
  struct Cfg {
    float momentum, dampening, weight_decay;
    bool nesterov;
  };
  uint64_t seed = 1;
  for (const Cfg c : {Cfg{0, 0, 0, false}, Cfg{0.9f, 0, 0, false}, Cfg{0.9f, 0.1f, 1e-2f, false},
                      Cfg{0.8f, 0, 1e-3f, true}}) {
    SCOPED_TRACE(::testing::Message() << "momentum " << c.momentum << " nesterov " << c.nesterov);
    Generator gen(seed++);
    Tensor p = random_cpu(kShape, gen), buf = Tensor::zeros(kShape);
    Tensor pd = p.to(gpu()), bufd = buf.to(gpu());
    const bool with_buf = c.momentum != 0;
    for (int step = 0; step < 3; ++step) {
      const Tensor g = random_cpu(kShape, gen);
      const kernels::SgdStep s{0.05f, c.momentum, c.dampening, c.weight_decay, c.nesterov, step == 0};
      kp::sgd_update(p, g, with_buf ? buf : Tensor(), s);
      kc::sgd_update(pd, g.to(gpu()), with_buf ? bufd : Tensor(), s);
      ASSERT_TRUE(close(pd, p, kAtol, kRtol)) << "step " << step;
      ASSERT_TRUE(close(bufd, buf, kAtol, kRtol)) << "step " << step;
    }
  }
}

TEST(CudaOptim, AdadeltaMatchesCpu) {
  TANDEM_NEED_GPUS(1);
  for (float wd : {0.0f, 1e-2f}) {
    Generator gen(10);
    Tensor p = random_cpu(kShape, gen), sq = Tensor::zeros(kShape), acc = Tensor::zeros(kShape);
    Tensor pd = p.to(gpu()), sqd = sq.to(gpu()), accd = acc.to(gpu());
    const kernels::AdadeltaStep s{1.0f, 0.9f, 1e-6f, wd};  // the MNIST recipe's lr 1.0
    for (int step = 0; step < 4; ++step) {
      const Tensor g = random_cpu(kShape, gen);
      kp::adadelta_update(p, g, sq, acc, s);
      kc::adadelta_update(pd, g.to(gpu()), sqd, accd, s);
      ASSERT_TRUE(close(pd, p, kAtol, kRtol)) << "step " << step << " wd " << wd;
      ASSERT_TRUE(close(sqd, sq, kAtol, kRtol)) << "step " << step;
      ASSERT_TRUE(close(accd, acc, 1e-9, kRtol)) << "step " << step;
    }
  }
}

TEST(CudaOptim, AdamAndAdamWMatchCpu) {
  TANDEM_NEED_GPUS(1);
  for (bool decoupled : {false, true}) {
    Generator gen(20);
    Tensor p = random_cpu(kShape, gen), m = Tensor::zeros(kShape), v = Tensor::zeros(kShape);
    Tensor pd = p.to(gpu()), md = m.to(gpu()), vd = v.to(gpu());
    const float beta1 = 0.9f, beta2 = 0.999f;
    for (int step = 1; step <= 4; ++step) {
      const Tensor g = random_cpu(kShape, gen);
      const auto s = kernels::AdamStep::make(1e-3, beta1, beta2, 1e-8, 1e-2, decoupled,
                                             1.0 - std::pow(double(beta1), step), 1.0 - std::pow(double(beta2), step));
      kp::adam_update(p, g, m, v, s);
      kc::adam_update(pd, g.to(gpu()), md, vd, s);
      ASSERT_TRUE(close(pd, p, kAtol, kRtol)) << "step " << step << " decoupled " << decoupled;
      ASSERT_TRUE(close(md, m, kAtol, kRtol)) << "step " << step;
      ASSERT_TRUE(close(vd, v, 1e-9, kRtol)) << "step " << step;
    }
  }
}

TEST(CudaOptim, StridedGradientAndErrors) {
  TANDEM_NEED_GPUS(1);
  Generator gen(30);
  Tensor p = random_cpu({6, 4}, gen);
  Tensor pd = p.to(gpu());
  const Tensor gs = random_cpu({4, 6}, gen);
  const kernels::SgdStep s{0.1f, 0, 0, 0, false, true};
  kp::sgd_update(p, gs.transpose(0, 1), Tensor(), s);
  kc::sgd_update(pd, gs.to(gpu()).transpose(0, 1), Tensor(), s);
  EXPECT_TRUE(close(pd, p, kAtol, kRtol));
  const Tensor p64 = Tensor::zeros({3}, kFloat64, gpu());
  EXPECT_TRUE(throws_with([&] { kc::sgd_update(p64, p64, Tensor(), s); }, {"sgd_update", "float32"}));
}

#endif  // TANDEM_WITH_CUDA
