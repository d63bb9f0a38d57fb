// Elementwise ops and reductions on CUDA against the CPU kernels: add, sub, mul and scale
// (exact), sum to a 0-D tensor (large and strided inputs), argmax with ties and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"

// The CUDA kernel table exists only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
// The two backends' kernel tables (kernels/ops.h).
const tandem::kernels::Backend& kc() { return *tandem::kernels::cuda_backend(); }
const tandem::kernels::Backend& kp() { return tandem::kernels::cpu_backend(); }

TEST(CudaElementwise, BinaryOpsAndScaleMatchCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(1);
  const Tensor a = random_cpu({37, 41}, gen), bs = random_cpu({41, 37}, gen);
  const Tensor b = bs.transpose(0, 1);  // strided operand
  const Tensor ad = a.to(gpu()), bd = bs.to(gpu()).transpose(0, 1);
  EXPECT_TRUE(same(kc().add(ad, bd), kp().add(a, b)));
  EXPECT_TRUE(same(kc().sub(ad, bd), kp().sub(a, b)));
  EXPECT_TRUE(same(kc().mul(ad, bd), kp().mul(a, b)));
  EXPECT_TRUE(close(kc().scale(ad, -0.3), kp().scale(a, -0.3), 0.0, 1e-7));
  EXPECT_TRUE(throws_with([&] { kc().add(ad, Tensor::zeros({3}, kFloat32, gpu())); }, {"add", "shape"}));
}

TEST(CudaElementwise, SumMatchesCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(2);
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{4097}, int64_t{1} << 20}) {
    SCOPED_TRACE(n);
    const Tensor a = random_cpu({n}, gen, 0.0, 1.0);
    const Tensor s = kc().sum(a.to(gpu()));
    EXPECT_EQ(s.dim(), 0);
    EXPECT_TRUE(close(s, kp().sum(a), 1e-6, 1e-5));
  }
  const Tensor m = random_cpu({30, 20}, gen);
  EXPECT_TRUE(close(kc().sum(m.to(gpu()).transpose(0, 1)), kp().sum(m), 1e-6, 1e-5));
  EXPECT_EQ(kc().sum(Tensor::zeros({0}, kFloat32, gpu())).item<float>(), 0.0f);
}

TEST(CudaElementwise, ArgmaxMatchesCpuWithTiesAndNan) {
  TANDEM_NEED_GPUS(1);
  Generator gen(3);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{64, 10}, {5, 100}, {3, 1}}) {
    const Tensor a = random_cpu({N, C}, gen);
    EXPECT_EQ(kc().argmax(a.to(gpu())).to_vector<int64_t>(), kp().argmax(a).to_vector<int64_t>());
    const Tensor ties = random_ties_cpu({N, C}, gen, 3);
    EXPECT_EQ(kc().argmax(ties.to(gpu())).to_vector<int64_t>(), kp().argmax(ties).to_vector<int64_t>());
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor with_nan = Tensor::from_vector<float>({1, nan, 3, nan, 2, 2, 1, 0, 0, 5, 5, 1}, {3, 4});
  EXPECT_EQ(kc().argmax(with_nan.to(gpu())).to_vector<int64_t>(), kp().argmax(with_nan).to_vector<int64_t>());
  EXPECT_EQ(kc().argmax(with_nan.to(gpu())).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
}

#endif  // TANDEM_WITH_CUDA
