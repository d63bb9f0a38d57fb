// BatchNorm2d::forward_conv_relu_pool2 (F::conv2d_batch_norm_relu_max_pool2d, the fused conv + batch norm
// + relu + 2x2 max-pool of kernels/conv_bn_pool.h) against forward_relu_pool2(conv(x)): the output, the
// running statistics, the batch count and the gradients of the conv's and the batch norm's parameters
// bitwise, in training and eval, at 1 and 2 threads; the fused node ran (its name) where the build has
// the fused kernels (AVX-512); an input that needs a gradient or another geometry take the ops one by one.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "core/autograd.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "kernels/conv_bn_pool.h"
#include "kernels/cpu/simd.h"
#include "nn/functional.h"
#include "nn/layers.h"

using namespace tandem;
namespace F = tandem::nn::functional;

namespace {

Tensor random_t(const Shape& shape, Generator& gen, double lo, double hi) {
  std::vector<double> v(shape_numel(shape));
  for (double& e : v) e = gen.uniform(lo, hi);
  return Tensor::from_vector<double>(v, shape).to(kFloat32);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

struct Layer {
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::vector<Tensor> params() const { return {conv->weight, conv->bias, bn->weight, bn->bias}; }
};

Layer make_layer(int64_t out, uint64_t seed) {
  manual_seed(seed);
  return {std::make_shared<nn::Conv2d>(1, out, 3), std::make_shared<nn::BatchNorm2d>(out)};
}

// Output of one step (loss = sum(out * gy)), the parameters' gradients, the buffers after it.
std::vector<Tensor> step(const Layer& l, const Tensor& x, const Tensor& gy, bool fused, std::string* node = nullptr) {
  l.conv->zero_grad();
  l.bn->zero_grad();
  const Tensor y = fused ? l.bn->forward_conv_relu_pool2(*l.conv, x) : l.bn->forward_relu_pool2((*l.conv)(x));
  if (node && y.grad_fn()) *node = y.grad_fn()->name();
  if (y.requires_grad()) F::sum(F::mul(y, gy)).backward();
  std::vector<Tensor> out = {y.detach(), l.bn->running_mean.clone(), l.bn->running_var.clone(),
                             l.bn->num_batches_tracked.clone()};
  for (const Tensor& p : l.params()) out.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  return out;
}

TEST(ConvBatchNormReluPoolLayer, BitwiseTheLayersOneByOne) {
  Generator gen(21);
  const Tensor x = random_t({16, 1, 28, 28}, gen, 0, 1);
  const Tensor gy = random_t({16, 32, 13, 13}, gen, -1, 1);
  for (int threads : {1, 2}) {
    const int saved = num_threads();
    set_num_threads(threads);
    const Layer a = make_layer(32, 5), b = make_layer(32, 5);
    for (bool training : {true, false}) {
      for (const Layer* l : {&a, &b}) {
        l->conv->train(training);
        l->bn->train(training);
      }
      std::string node;
      const std::vector<Tensor> got = step(a, x, gy, true, &node), want = step(b, x, gy, false);
      // The fused op where the build has its kernels (AVX-512), else the ops one by one.
      const bool fused = kernels::conv_batch_norm_relu_pool2d_applies(x, a.conv->weight, a.conv->bias, {});
      EXPECT_EQ(fused, kernels::cpu::compiled_simd_level() == kernels::cpu::SimdLevel::avx512);
      EXPECT_EQ(node, fused ? "ConvBatchNormReluMaxPool2dBackward" : "BatchNormReluMaxPool2dBackward");
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(same_bits(got[i], want[i])) << "threads " << threads << (training ? " train" : " eval")
                                                << ", result " << i;
      }
    }
    set_num_threads(saved);
  }
}

TEST(ConvBatchNormReluPoolLayer, TheOpsOneByOneWhereTheFusedOpDoesNotApply) {
  Generator gen(22);
  const Layer l = make_layer(4, 7);
  // The input needs a gradient: the conv's own backward gives it.
  const Tensor x = random_t({2, 1, 8, 8}, gen, 0, 1).set_requires_grad(true);
  std::string node;
  step(l, x, random_t({2, 4, 3, 3}, gen, -1, 1), true, &node);
  EXPECT_EQ(node, "BatchNormReluMaxPool2dBackward");
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().shape(), x.shape());
  // Padding: not the fused geometry.
  manual_seed(8);
  auto padded = std::make_shared<nn::Conv2d>(1, 4, 3, 1, 1);
  nn::BatchNorm2d bn(4);
  const Tensor y = bn.forward_conv_relu_pool2(*padded, random_t({2, 1, 8, 8}, gen, 0, 1));
  EXPECT_EQ(y.shape(), (Shape{2, 4, 4, 4}));
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "BatchNormReluMaxPool2dBackward");
  // A batch norm of another width than the conv's output: named.
  nn::BatchNorm2d narrow(3);
  try {
    narrow.forward_conv_relu_pool2(*padded, random_t({2, 1, 8, 8}, gen, 0, 1));
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("expected a conv with 3 output channels, got 4"), std::string::npos)
        << e.what();
  }
}

}  // namespace
