// linear and matmul on CUDA (cuBLAS with the row-major transposition trick) against the CPU
// kernels: forward with and without bias, the three gradients, the MNIST net's shapes, strided
// operands, empty batches and mismatched shapes.
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/linear.h"

// The cuda:: kernels exist only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
namespace kc = tandem::kernels::cuda;
namespace kp = tandem::kernels::cpu;

namespace {

void check(int64_t N, int64_t in, int64_t out, bool bias, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "N " << N << " in " << in << " out " << out << " bias " << bias);
  Generator gen(seed);
  const Tensor x = random_cpu({N, in}, gen);
  const Tensor w = random_cpu({out, in}, gen, -0.1, 0.1);
  const Tensor b = bias ? random_cpu({out}, gen) : Tensor();
  const Tensor y_ref = kp::linear_forward(x, w, b);
  const Tensor y = kc::linear_forward(x.to(gpu()), w.to(gpu()), bias ? b.to(gpu()) : Tensor());
  EXPECT_TRUE(close(y, y_ref, 1e-4, 1e-4));
  const Tensor dy = random_cpu({N, out}, gen);
  const kernels::LinearGrads ref = kp::linear_backward(dy, x, w, true, true, bias);
  const kernels::LinearGrads got = kc::linear_backward(dy.to(gpu()), x.to(gpu()), w.to(gpu()), true, true, bias);
  EXPECT_TRUE(close(got.input, ref.input, 1e-4, 1e-4));
  EXPECT_TRUE(close(got.weight, ref.weight, 1e-4, 1e-4));
  if (bias) {
    EXPECT_TRUE(close(got.bias, ref.bias, 1e-4, 1e-4));
  } else {
    EXPECT_FALSE(got.bias.defined());
  }
}

}  // namespace

TEST(CudaLinear, MatchesCpu) {
  TANDEM_NEED_GPUS(1);
  check(64, 1600, 128, true, 1);  // fc1
  check(64, 128, 10, true, 2);    // fc2
  check(5, 7, 3, false, 3);
  check(1, 1, 1, true, 4);
}

TEST(CudaLinear, StridedOperands) {
  TANDEM_NEED_GPUS(1);
  Generator gen(5);
  const Tensor xs = random_cpu({9, 6}, gen), ws = random_cpu({9, 4}, gen), b = random_cpu({4}, gen);
  const Tensor x = xs.transpose(0, 1), w = ws.transpose(0, 1);  // [6, 9] and [4, 9]
  const Tensor xd = xs.to(gpu()).transpose(0, 1), wd = ws.to(gpu()).transpose(0, 1);
  EXPECT_TRUE(close(kc::linear_forward(xd, wd, b.to(gpu())), kp::linear_forward(x, w, b), 1e-5, 1e-5));
  const Tensor dys = random_cpu({4, 6}, gen);
  const kernels::LinearGrads ref = kp::linear_backward(dys.transpose(0, 1), x, w, true, true, true);
  const kernels::LinearGrads got = kc::linear_backward(dys.to(gpu()).transpose(0, 1), xd, wd, true, true, true);
  EXPECT_TRUE(close(got.input, ref.input, 1e-5, 1e-5));
  EXPECT_TRUE(close(got.weight, ref.weight, 1e-5, 1e-5));
  EXPECT_TRUE(close(got.bias, ref.bias, 1e-5, 1e-5));
}

TEST(CudaLinear, EmptyBatch) {
  TANDEM_NEED_GPUS(1);
  const Tensor x = Tensor::zeros({0, 5}, kFloat32, gpu());
  const Tensor w = Tensor::ones({3, 5}, kFloat32, gpu());
  const Tensor b = Tensor::ones({3}, kFloat32, gpu());
  EXPECT_EQ(kc::linear_forward(x, w, b).shape(), Shape({0, 3}));
  const kernels::LinearGrads g = kc::linear_backward(Tensor::zeros({0, 3}, kFloat32, gpu()), x, w, true, true, true);
  EXPECT_EQ(g.input.shape(), Shape({0, 5}));
  EXPECT_TRUE(same(g.weight, Tensor::zeros({3, 5})));  // an empty sum
  EXPECT_TRUE(same(g.bias, Tensor::zeros({3})));
}

TEST(CudaMatmul, MatchesCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(6);
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{3, 4, 5}, {17, 33, 9}, {1, 64, 1}, {128, 1, 7}}) {
    SCOPED_TRACE(::testing::Message() << M << "x" << K << " * " << K << "x" << N);
    const Tensor a = random_cpu({M, K}, gen), b = random_cpu({K, N}, gen);
    EXPECT_TRUE(close(kc::matmul(a.to(gpu()), b.to(gpu())), kp::matmul(a, b), 1e-5, 1e-5));
  }
  const Tensor a = Tensor::zeros({2, 3}, kFloat32, gpu()), b = Tensor::zeros({4, 2}, kFloat32, gpu());
  EXPECT_TRUE(throws_with([&] { kc::matmul(a, b); }, {"matmul"}));
}

#endif  // TANDEM_WITH_CUDA
