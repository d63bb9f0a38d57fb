// relu on CUDA against the CPU kernel: forward and backward are exact (no rounding), on
// contiguous and strided inputs, with exact zeros in the input.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/activation.h"

// The cuda:: kernels exist only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
namespace kc = tandem::kernels::cuda;
namespace kp = tandem::kernels::cpu;

TEST(CudaRelu, ForwardAndBackwardMatchCpuExactly) {
  TANDEM_NEED_GPUS(1);
  Generator gen(1);
  Tensor x = random_cpu({64, 32, 13, 13}, gen);
  Tensor xz = x.select(0, 0);  // some exact zeros: relu'(0) = 0 on both sides
  xz.zero_();
  const Tensor y_ref = kp::relu_forward(x);
  const Tensor y = kc::relu_forward(x.to(gpu()));
  EXPECT_TRUE(same(y, y_ref));
  const Tensor g = random_cpu(x.shape(), gen);
  EXPECT_TRUE(same(kc::relu_backward(g.to(gpu()), y), kp::relu_backward(g, y_ref)));
}

TEST(CudaRelu, StridedInputs) {
  TANDEM_NEED_GPUS(1);
  Generator gen(2);
  const Tensor stored = random_cpu({7, 5}, gen);
  const Tensor x = stored.transpose(0, 1);
  const Tensor x_dev = stored.to(gpu()).transpose(0, 1);
  const Tensor y = kc::relu_forward(x_dev);
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_TRUE(same(y, kp::relu_forward(x)));
  const Tensor g_stored = random_cpu({7, 5}, gen);
  EXPECT_TRUE(same(kc::relu_backward(g_stored.to(gpu()).transpose(0, 1), y),
                   kp::relu_backward(g_stored.transpose(0, 1), kp::relu_forward(x))));
}

TEST(CudaRelu, RejectsFloat64) {
  TANDEM_NEED_GPUS(1);
  const Tensor x = Tensor::zeros({3}, kFloat64, gpu());
  EXPECT_TRUE(throws_with([&] { kc::relu_forward(x); }, {"relu_forward", "float32"}));
}

#endif  // TANDEM_WITH_CUDA
