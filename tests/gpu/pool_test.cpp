// max_pool2d on CUDA against the CPU kernel: outputs and int64 indices exactly equal (ties to the
// first maximum, padding never winning), floor-mode shapes, overlapping windows, strided input,
// and the backward scatter.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/pool.h"

// The cuda:: kernels exist only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
namespace kc = tandem::kernels::cuda;
namespace kp = tandem::kernels::cpu;

namespace {

void check(const Tensor& x_cpu, const Tensor& x_dev, const kernels::MaxPool2dArgs& a, Generator& gen) {
  SCOPED_TRACE(::testing::Message() << shape_str(x_cpu.shape()) << " kernel " << a.kernel_h << "x" << a.kernel_w
                                    << " stride " << a.stride_h << "," << a.stride_w << " pad " << a.pad_h << ","
                                    << a.pad_w);
  const kernels::MaxPool2dForward ref = kp::max_pool2d_forward(x_cpu, a);
  const kernels::MaxPool2dForward got = kc::max_pool2d_forward(x_dev, a);
  EXPECT_TRUE(same(got.output, ref.output));
  ASSERT_EQ(got.indices.dtype(), kInt64);
  EXPECT_EQ(got.indices.to_vector<int64_t>(), ref.indices.to_vector<int64_t>());
  const Tensor dy = random_cpu(ref.output.shape(), gen);
  const Tensor dx_ref = kp::max_pool2d_backward(dy, ref.indices, x_cpu.shape());
  const Tensor dx = kc::max_pool2d_backward(dy.to(gpu()), got.indices, x_cpu.shape());
  // Overlapping windows add several gradients into one input in any order.
  EXPECT_TRUE(close(dx, dx_ref, 1e-6, 1e-6));
}

}  // namespace

TEST(CudaMaxPool2d, MatchesCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(1);
  const kernels::MaxPool2dArgs cases[] = {
      {2, 2, 2, 2, 0, 0},  // the MNIST net's
      {3, 3, 2, 2, 1, 1},  // padding
      {3, 2, 1, 1, 0, 1},  // overlapping windows
      {2, 3, 3, 2, 1, 0},  // floor mode drops the ragged edge
  };
  for (const auto& a : cases) {
    const Tensor x = random_cpu({4, 3, 11, 9}, gen);
    check(x, x.to(gpu()), a, gen);
  }
  const Tensor mnist = random_cpu({16, 32, 26, 26}, gen);
  check(mnist, mnist.to(gpu()), {}, gen);
}

TEST(CudaMaxPool2d, TiesGoToTheFirstMaximumAndPaddingNeverWins) {
  TANDEM_NEED_GPUS(1);
  Generator gen(2);
  const Tensor ties = random_ties_cpu({2, 3, 8, 8}, gen, 3);
  check(ties, ties.to(gpu()), {3, 3, 2, 2, 1, 1}, gen);
  check(ties, ties.to(gpu()), {2, 2, 2, 2, 0, 0}, gen);
  const Tensor negative = Tensor::full({1, 1, 4, 4}, -5.0);  // all below the zero a padded cell would be
  check(negative, negative.to(gpu()), {3, 3, 1, 1, 1, 1}, gen);
}

TEST(CudaMaxPool2d, StridedInput) {
  TANDEM_NEED_GPUS(1);
  Generator gen(3);
  const Tensor stored = random_cpu({2, 3, 9, 10}, gen);
  check(stored.transpose(2, 3), stored.to(gpu()).transpose(2, 3), {2, 2, 2, 2, 0, 0}, gen);
}

#endif  // TANDEM_WITH_CUDA
