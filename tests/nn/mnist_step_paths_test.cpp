// The kernels one MnistNet training step takes on the CPU in float32 (forward, nll_loss, backward,
// SGD step): log_softmax's rows through the general softmax entry points and nll_loss's one-pass
// mean (fast_path_count), and
// the vector rows of the fused batch_norm+relu+max-pool and conv kernels (simd_path_count) at the
// level this build's rows have (AVX-512 rows for all, AVX2 rows for the fused pool only; the
// 32-channel conv may run on oneDNN instead, gemm_path_count), and linear's: one call per layer
// each way, the large fc1 on this build's rows.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/random.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"
#include "nn/functional.h"
#include "nn/models/mnist_net.h"
#include "optim/optimizer.h"

using namespace tandem;
using kernels::cpu::GemmKernel;
using kernels::cpu::GemmPath;
using kernels::cpu::SimdKernel;
using kernels::cpu::SimdLevel;

namespace {

constexpr SimdLevel kLevels[] = {SimdLevel::portable, SimdLevel::avx2, SimdLevel::avx512};

struct Counts {
  std::map<std::string, int64_t> fast;
  std::map<std::pair<int, int>, uint64_t> simd;  // (kernel, level) -> calls
  uint64_t conv_onednn[2] = {0, 0};              // conv2d forward, backward calls on oneDNN
};

constexpr SimdKernel kStepKernels[] = {SimdKernel::bn_relu_pool_forward, SimdKernel::bn_relu_pool_backward,
                                       SimdKernel::conv2d_forward,       SimdKernel::conv2d_backward,
                                       SimdKernel::linear_forward,       SimdKernel::linear_backward,
                                       SimdKernel::max_pool2d_forward};

Counts read_counts() {
  Counts c;
  for (const char* op : kernels::fast_path_ops()) c.fast[op] = kernels::fast_path_count(op);
  for (SimdKernel k : kStepKernels)
    for (SimdLevel l : kLevels) c.simd[{int(k), int(l)}] = kernels::cpu::simd_path_count(k, l);
  c.conv_onednn[0] = kernels::cpu::gemm_path_count(GemmKernel::conv2d_forward, GemmPath::onednn_f32);
  c.conv_onednn[1] = kernels::cpu::gemm_path_count(GemmKernel::conv2d_backward, GemmPath::onednn_f32);
  return c;
}

// The level a float32 call of `k` takes in this build.
SimdLevel float_level(SimdKernel k) {
  const SimdLevel built = kernels::cpu::compiled_simd_level();
  if (built == SimdLevel::avx512) return built;
  const bool has_avx2_rows = k == SimdKernel::bn_relu_pool_forward || k == SimdKernel::bn_relu_pool_backward;
  return built == SimdLevel::avx2 && has_avx2_rows ? built : SimdLevel::portable;
}

}  // namespace

TEST(MnistStepPaths, OneTrainingStepTakesTheFastKernels) {
  manual_seed(7);
  nn::models::MnistNet net;
  net.train();
  optim::SGD sgd(net.parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
  Generator gen(11);
  std::vector<float> pixels(8 * 28 * 28);
  for (float& p : pixels) p = static_cast<float>(gen.uniform(-1.0, 1.0));
  const Tensor x = Tensor::from_vector<float>(pixels, {8, 1, 28, 28});
  std::vector<int64_t> labels{0, 1, 2, 3, 4, 5, 6, 7};
  const Tensor y = Tensor::from_vector<int64_t>(labels, {8});

  const Counts before = read_counts();
  sgd.zero_grad();
  Tensor loss = nn::functional::nll_loss(net.forward(x), y);
  loss.backward();
  sgd.step();
  const Counts after = read_counts();

  // log_softmax over the classes of [N, 10] (softmax_forward/backward with log) takes the rows.
  EXPECT_EQ(after.fast.at("log_softmax_forward") - before.fast.at("log_softmax_forward"), 1);
  EXPECT_EQ(after.fast.at("log_softmax_backward") - before.fast.at("log_softmax_backward"), 1);
  // nll_loss's mean without class weights takes its one-pass kernels.
  EXPECT_EQ(after.fast.at("nll_loss_mean_forward") - before.fast.at("nll_loss_mean_forward"), 1);
  EXPECT_EQ(after.fast.at("nll_loss_mean_backward") - before.fast.at("nll_loss_mean_backward"), 1);

  // Two of each layer: every call on the rows of this build's level, none elsewhere; the 2x2
  // max-pool runs inside the fused batch_norm+relu+pool, never on its own.
  const std::map<SimdKernel, uint64_t> calls = {
      {SimdKernel::bn_relu_pool_forward, 2}, {SimdKernel::bn_relu_pool_backward, 2},
      {SimdKernel::max_pool2d_forward, 0}};
  const auto calls_on = [&](SimdKernel k, SimdLevel l) {
    return after.simd.at({int(k), int(l)}) - before.simd.at({int(k), int(l)});
  };
  // The convolutions: conv1 (one input channel) on the engine's rows of this build's level; conv2
  // (32 -> 64 channels) there too, or on oneDNN where the build has it (kernels/cpu/conv.cpp).
  const SimdKernel conv[2] = {SimdKernel::conv2d_forward, SimdKernel::conv2d_backward};
  for (int d = 0; d < 2; ++d) {
    const uint64_t on_onednn = after.conv_onednn[d] - before.conv_onednn[d];
    EXPECT_LE(on_onednn, 1u) << "conv direction " << d;
    for (SimdLevel l : kLevels) {
      EXPECT_EQ(calls_on(conv[d], l), l == float_level(conv[d]) ? 2u - on_onednn : 0u)
          << "conv direction " << d << " on the " << kernels::cpu::simd_level_name(l) << " rows";
    }
  }
  for (const auto& [k, n] : calls) {
    for (SimdLevel l : kLevels) {
      EXPECT_EQ(calls_on(k, l), l == float_level(k) ? n : 0u)
          << "kernel " << int(k) << " on the " << kernels::cpu::simd_level_name(l) << " rows";
    }
  }
  // The two Linear layers: one call each way per layer. Which rows a call takes depends on the
  // product's size (kernels/cpu/linear.cpp: the small GEMM only for products of 2^18 or more, so
  // fc1 [8, 1600] x [1600, 128] but not fc2 [8, 128] x [128, 10]).
  const SimdLevel fc1_level = float_level(SimdKernel::linear_forward);
  for (SimdKernel k : {SimdKernel::linear_forward, SimdKernel::linear_backward}) {
    uint64_t total = 0;
    for (SimdLevel l : kLevels) total += calls_on(k, l);
    EXPECT_EQ(total, 2u) << "kernel " << int(k);
    EXPECT_GE(calls_on(k, fc1_level), 1u) << "kernel " << int(k) << ": fc1 left the rows of this build";
  }
}
