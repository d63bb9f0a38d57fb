// The batch norms under bf16 autocast on the CPU (nn/functional.h): conv2d returns bf16 and
// batch_norm, batch_norm_relu and batch_norm_relu_max_pool2d take it as it is, with no cast between
// them in the graph (the batch norm's node leads straight to the convolution's, and two casts fewer
// run per step), and the same bits as the graph with the cast: output, running statistics, and the
// gradients of the input, the convolution's and the batch norm's parameters; training and eval.
#include <gtest/gtest.h>

#include <cstring>

#include "core/autograd.h"
#include "core/profiler.h"
#include "core/random.h"
#include "nn/amp.h"
#include "nn/functional.h"

using namespace tandem;
namespace F = tandem::nn::functional;

namespace {

enum class Op { plain, relu, pool };

Tensor rand_t(const Shape& s, Generator& gen, double lo = -1, double hi = 1) {
  std::vector<float> v(shape_numel(s));
  for (float& x : v) x = static_cast<float>(gen.uniform(lo, hi));
  return Tensor::from_vector<float>(v, s);
}

::testing::AssertionResult same_bits(const Tensor& got, const Tensor& ref) {
  if (!got.defined() || !ref.defined()) return ::testing::AssertionFailure() << "undefined";
  if (got.shape() != ref.shape() || got.dtype() != ref.dtype()) {
    return ::testing::AssertionFailure() << got.str() << " vs " << ref.str();
  }
  if (std::memcmp(got.raw_data(), ref.raw_data(), got.nbytes()) != 0) {
    return ::testing::AssertionFailure() << "bits differ: " << got.str();
  }
  return ::testing::AssertionSuccess();
}

struct Result {
  Tensor out, running_mean, running_var;
  std::vector<Tensor> grads;  // x, conv weight, conv bias, bn weight, bn bias
  int64_t casts = 0;          // kernels' cast calls, forward and backward
  std::string bn_input_node;  // the node the batch norm's input gradient flows to
  bool input_is_conv = false;  // ... and whether it is the one of conv2d's output
};

// x -> conv2d (bf16 under autocast) -> [cast to f32 when with_cast] -> the batch norm -> sum(out * g).
Result run(Op op, bool training, bool with_cast) {
  Generator gen(77);
  Tensor x = rand_t({4, 3, 12, 11}, gen).set_requires_grad(true);
  Tensor cw = rand_t({6, 3, 3, 3}, gen, -0.5, 0.5).set_requires_grad(true);
  Tensor cb = rand_t({6}, gen).set_requires_grad(true);
  Tensor w = rand_t({6}, gen, 0.5, 1.5).set_requires_grad(true), b = rand_t({6}, gen, -0.3, 0.3).set_requires_grad(true);
  Result r;
  r.running_mean = rand_t({6}, gen, -0.1, 0.1);
  r.running_var = rand_t({6}, gen, 0.5, 1.5);
  profiler::reset();
  profiler::set_enabled(true);
  {
    amp::AutocastGuard guard(amp::Precision::kBFloat16);
    Tensor h = F::conv2d(x, cw, cb, 1, 0);
    EXPECT_EQ(h.dtype(), kBFloat16);
    const std::shared_ptr<Node> conv_node = h.grad_fn();
    if (with_cast) h = F::cast(h, kFloat32);
    r.out = op == Op::plain  ? F::batch_norm(h, r.running_mean, r.running_var, w, b, training, 0.1, 1e-5)
            : op == Op::relu ? F::batch_norm_relu(h, r.running_mean, r.running_var, w, b, training, 0.1, 1e-5)
                             : F::batch_norm_relu_max_pool2d(h, r.running_mean, r.running_var, w, b, training,
                                                             0.1, 1e-5);
    EXPECT_EQ(r.out.dtype(), kFloat32);
    r.bn_input_node = r.out.grad_fn()->next_edges.at(0).fn->name();
    r.input_is_conv = r.out.grad_fn()->next_edges.at(0).fn == conv_node;
  }
  const Tensor g = rand_t(r.out.shape(), gen);
  F::sum(F::mul(r.out, g)).backward();
  profiler::set_enabled(false);
  for (const auto& s : profiler::snapshot()) {
    if (s.op == "cast") r.casts += s.calls;
  }
  profiler::reset();
  r.out = r.out.detach();
  r.grads = {x.grad(), cw.grad(), cb.grad(), w.grad(), b.grad()};
  return r;
}

void check(Op op, bool training) {
  SCOPED_TRACE(std::string(op == Op::plain ? "batch_norm" : op == Op::relu ? "batch_norm_relu" : "pool") +
               (training ? " train" : " eval"));
  const Result direct = run(op, training, /*with_cast=*/false);
  const Result cast = run(op, training, /*with_cast=*/true);
  EXPECT_EQ(cast.bn_input_node, "CastBackward");
  EXPECT_FALSE(cast.input_is_conv);
  EXPECT_TRUE(direct.input_is_conv) << "the batch norm's input gradient goes to " << direct.bn_input_node;
  EXPECT_EQ(cast.casts - direct.casts, 2) << "the cast up and its backward's cast down are gone";
  EXPECT_TRUE(same_bits(direct.out, cast.out)) << "output";
  EXPECT_TRUE(same_bits(direct.running_mean, cast.running_mean));
  EXPECT_TRUE(same_bits(direct.running_var, cast.running_var));
  for (size_t i = 0; i < direct.grads.size(); ++i) {
    EXPECT_EQ(direct.grads[i].dtype(), kFloat32) << i;
    EXPECT_TRUE(same_bits(direct.grads[i], cast.grads[i])) << "gradient " << i;
  }
}

}  // namespace

TEST(AmpBatchNorm, Bf16ConvOutputGoesStraightIntoBatchNorm) {
  check(Op::plain, true);
  check(Op::plain, false);
}

TEST(AmpBatchNorm, Bf16ConvOutputGoesStraightIntoBatchNormRelu) {
  check(Op::relu, true);
  check(Op::relu, false);
}

TEST(AmpBatchNorm, Bf16ConvOutputGoesStraightIntoBatchNormReluMaxPool) {
  check(Op::pool, true);
  check(Op::pool, false);
}
