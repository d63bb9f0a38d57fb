// Finite-difference gradient checks in float64 on CUDA (tests/nn/gradcheck.h with a device): the ops
// whose CUDA kernels have a float64 path (pointwise, reductions, softmax and log_softmax with the
// rows' fast path, relu, matmul (2-D and batched) and linear on cuBLAS dgemm, layer_norm, the index
// ops and cross_entropy through them, conv2d on cuDNN's double convolutions, max and average
// pooling, prod, cumsum and sort), forward and backward run on the GPU, the central differences too.
// Uses only device-neutral names, so it also compiles in a build without CUDA (where every test
// skips, or fails under TANDEM_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "core/random.h"
#include "gpu_test_util.h"
#include "nn/nn.h"
#include "tests/nn/gradcheck.h"

namespace {

using namespace tandem;
using namespace tandem::gpu_test;
using tandem::testing::gradcheck;
using tandem::testing::random_f64;
namespace F = tandem::nn::functional;
using V = std::vector<Tensor>;

constexpr double kAtol = 1e-6, kRtol = 1e-4;

void check(const std::function<Tensor(const V&)>& fn, V inputs, std::vector<size_t> which) {
  gradcheck(fn, std::move(inputs), std::move(which), kAtol, kRtol, gpu());
}

}  // namespace

TEST(CudaGradCheck, PointwiseInFloat64) {
  TANDEM_NEED_GPUS(1);
  Generator g(41);
  const Tensor probe = F::add(random_f64({3}, g).to(gpu()), 1.0);
  ASSERT_EQ(probe.dtype(), kFloat64);
  ASSERT_TRUE(probe.device().is_cuda());
  check([](const V& in) { return F::add(in[0], in[1]); }, {random_f64({4, 1, 3}, g), random_f64({5, 1}, g)}, {0, 1});
  check([](const V& in) { return F::sub(in[0], in[1]); }, {random_f64({3, 4}, g), random_f64({3, 4}, g)}, {0, 1});
  check([](const V& in) { return F::mul(in[0], in[1]); }, {random_f64({3, 4}, g), random_f64({3, 4}, g)}, {0, 1});
  check([](const V& in) { return F::div(in[0], in[1]); }, {random_f64({2, 3}, g), random_f64({3}, g, 0.5, 2.0)},
        {0, 1});
  check([](const V& in) { return F::pow(in[0], in[1]); }, {random_f64({3, 2}, g, 0.5, 2.0), random_f64({2}, g)},
        {0, 1});
  check([](const V& in) { return F::maximum(in[0], in[1]); }, {random_f64({3, 4}, g), random_f64({4}, g)}, {0, 1});
  check([](const V& in) { return F::add(F::mul(in[0], 2.5), F::sub(in[0], 1.0)); }, {random_f64({5}, g)}, {0});
  check([](const V& in) { return F::tanh(F::exp(in[0])); }, {random_f64({2, 3}, g)}, {0});
  check([](const V& in) { return F::sigmoid(F::log(in[0])); }, {random_f64({4}, g, 0.5, 2.0)}, {0});
  check([](const V& in) { return F::gelu(F::sqrt(in[0]), "none"); }, {random_f64({4}, g, 0.5, 2.0)}, {0});
  check([](const V& in) { return F::relu(in[0]); }, {random_f64({3, 5}, g)}, {0});
  check([](const V& in) { return F::where(F::gt(in[0], in[1]), in[0], in[1]); },
        {random_f64({3, 4}, g), random_f64({3, 4}, g)}, {0, 1});
}

TEST(CudaGradCheck, ReductionsAndSoftmaxInFloat64) {
  TANDEM_NEED_GPUS(1);
  Generator g(42);
  check([](const V& in) { return F::sum(in[0]); }, {random_f64({3, 4}, g)}, {0});
  check([](const V& in) { return F::sum(in[0], {0, 2}, true); }, {random_f64({2, 3, 4}, g)}, {0});
  check([](const V& in) { return F::mean(in[0], {1}); }, {random_f64({3, 5}, g)}, {0});
  check([](const V& in) { return F::amax(in[0], {1}); }, {random_f64({3, 5}, g)}, {0});
  check([](const V& in) { return F::max(in[0], 0).values; }, {random_f64({4, 3}, g)}, {0});
  check([](const V& in) { return F::softmax(in[0], 1); }, {random_f64({2, 4, 3}, g)}, {0});
  check([](const V& in) { return F::softmax(in[0], -1); }, {random_f64({3, 6}, g)}, {0});
  // [N, C] over the classes: the rows' fast path; over dim 0 the general kernel.
  check([](const V& in) { return F::log_softmax(in[0], -1); }, {random_f64({4, 7}, g)}, {0});
  check([](const V& in) { return F::log_softmax(in[0], 0); }, {random_f64({4, 7}, g)}, {0});
  check([](const V& in) { return F::prod(in[0], 1); }, {random_f64({3, 4}, g, 0.5, 2.0)}, {0});
  check([](const V& in) { return F::cumsum(in[0], 0); }, {random_f64({4, 3}, g)}, {0});
  check([](const V& in) { return F::sort(in[0], 1).values; }, {random_f64({3, 5}, g)}, {0});
}

TEST(CudaGradCheck, MatmulLinearLayerNormAndLossesInFloat64) {
  TANDEM_NEED_GPUS(1);
  Generator g(43);
  check([](const V& in) { return F::matmul(in[0], in[1]); }, {random_f64({3, 4}, g), random_f64({4, 2}, g)}, {0, 1});
  check([](const V& in) { return F::matmul(in[0], in[1]); }, {random_f64({2, 3, 4}, g), random_f64({2, 4, 2}, g)},
        {0, 1});
  check([](const V& in) { return F::linear(in[0], in[1], in[2]); },
        {random_f64({5, 4}, g), random_f64({3, 4}, g), random_f64({3}, g)}, {0, 1, 2});
  check([](const V& in) { return F::layer_norm(in[0], {6}, in[1], in[2]); },
        {random_f64({4, 6}, g), random_f64({6}, g), random_f64({6}, g)}, {0, 1, 2});
  const Tensor target = Tensor::from_vector<int64_t>({2, 0, 4, 1}, {4});
  check([&](const V& in) { return F::nll_loss(F::log_softmax(in[0], -1), target.to(gpu())); },
        {random_f64({4, 5}, g)}, {0});
  const Tensor ignored = Tensor::from_vector<int64_t>({2, -100, 4, 1}, {4});
  check([&](const V& in) { return F::cross_entropy(in[0], ignored.to(gpu()), -100, 0.1); }, {random_f64({4, 5}, g)},
        {0});
  const Tensor index = Tensor::from_vector<int64_t>({1, 0, 1}, {3});
  check([&](const V& in) { return F::index_select(in[0], 0, index.to(gpu())); }, {random_f64({2, 3}, g)}, {0});
}

TEST(CudaGradCheck, ConvolutionAndPoolingInFloat64) {
  TANDEM_NEED_GPUS(1);
  Generator g(44);
  check([](const V& in) { return F::conv2d(in[0], in[1], in[2], 2, 1); },
        {random_f64({2, 2, 7, 6}, g), random_f64({3, 2, 3, 3}, g), random_f64({3}, g)}, {0, 1, 2});
  // stride (2, 1), padding (1, 2), dilation (2, 1), 2 groups: one cuDNN convolution
  check([](const V& in) { return F::conv2d(in[0], in[1], in[2], F::Conv2dParams{{2, 1}, {1, 2}, {2, 1}, 2}); },
        {random_f64({1, 4, 6, 5}, g), random_f64({4, 2, 2, 2}, g), random_f64({4}, g)}, {0, 1, 2});
  for (bool ceil_mode : {false, true})
    check([&](const V& in) { return F::avg_pool2d(in[0], 3, 2, 1, ceil_mode, !ceil_mode); },
          {random_f64({1, 2, 6, 5}, g)}, {0});
  check([](const V& in) { return F::adaptive_avg_pool2d(F::transpose(in[0], 2, 3), {3, 2}); },
        {random_f64({2, 1, 4, 7}, g)}, {0});
  check([](const V& in) { return F::max_pool2d(in[0], 2, 2, 1, 2, true); }, {random_f64({1, 2, 7, 6}, g)}, {0});
  check([](const V& in) { return F::adaptive_max_pool2d(in[0], {3, 2}); }, {random_f64({2, 5, 7}, g)}, {0});
}
