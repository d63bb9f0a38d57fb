// clip_grad_norm_ against hand-computed norms (2, 1 and inf), as torch.nn.utils.clip_grad_norm_:
// the returned norm is the one before clipping, gradients are scaled by max_norm / (norm + 1e-6)
// only when that is below 1, parameters without a gradient are skipped, bad arguments are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/tensor.h"
#include "optim/clip_grad.h"

namespace tandem {
namespace {

std::vector<Tensor> params_with_grads() {
  Tensor a = Tensor::zeros({2}), b = Tensor::zeros({1}), c = Tensor::zeros({3});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  c.set_requires_grad(true);  // no gradient: skipped
  a.set_grad(Tensor::from_vector(std::vector<float>{3, -4}, {2}));
  b.set_grad(Tensor::from_vector(std::vector<float>{12}, {1}));
  return {a, b, c};
}

TEST(ClipGrad, TwoNormClipsToMaxNorm) {
  auto p = params_with_grads();
  const double total = optim::clip_grad_norm_(p, 6.5, 2.0);
  EXPECT_DOUBLE_EQ(total, 13.0);  // sqrt(9 + 16 + 144)
  const float coef = static_cast<float>(6.5 / (13.0 + 1e-6));
  EXPECT_FLOAT_EQ(p[0].grad().to_vector<float>()[0], 3 * coef);
  EXPECT_FLOAT_EQ(p[0].grad().to_vector<float>()[1], -4 * coef);
  EXPECT_FLOAT_EQ(p[1].grad().to_vector<float>()[0], 12 * coef);
  EXPECT_FALSE(p[2].grad().defined());
}

TEST(ClipGrad, BelowMaxNormLeavesGradientsAlone) {
  auto p = params_with_grads();
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(p, 100.0, 2.0), 13.0);
  EXPECT_EQ(p[1].grad().to_vector<float>()[0], 12.0f);
}

TEST(ClipGrad, OneAndInfinityNorms) {
  auto p = params_with_grads();
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(p, 1000.0, 1.0), 19.0);
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(p, 6.0, std::numeric_limits<double>::infinity()), 12.0);
  EXPECT_FLOAT_EQ(p[1].grad().to_vector<float>()[0], static_cast<float>(12 * (6.0 / (12.0 + 1e-6))));
}

TEST(ClipGrad, RefusesBadArguments) {
  auto p = params_with_grads();
  EXPECT_THROW(optim::clip_grad_norm_(p, 0.0, 2.0), Error);
  EXPECT_THROW(optim::clip_grad_norm_(p, 1.0, 0.5), Error);
}

}  // namespace
}  // namespace tandem
