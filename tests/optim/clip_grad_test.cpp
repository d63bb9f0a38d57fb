// clip_grad_norm_ against hand-computed norms (2, 1 and inf), as torch.nn.utils.clip_grad_norm_:
// the returned norm is the one before clipping, gradients are scaled by max_norm / (norm + 1e-6)
// only when that is below 1, parameters without a gradient are skipped, bad arguments are refused;
// the device way (foreach) gives the host way's results.
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
  const double total = optim::clip_grad_norm_(p, 6.5, 2.0).item<double>();
  EXPECT_DOUBLE_EQ(total, 13.0);  // sqrt(9 + 16 + 144)
  const float coef = static_cast<float>(6.5 / (13.0 + 1e-6));
  EXPECT_FLOAT_EQ(p[0].grad().to_vector<float>()[0], 3 * coef);
  EXPECT_FLOAT_EQ(p[0].grad().to_vector<float>()[1], -4 * coef);
  EXPECT_FLOAT_EQ(p[1].grad().to_vector<float>()[0], 12 * coef);
  EXPECT_FALSE(p[2].grad().defined());
}

TEST(ClipGrad, BelowMaxNormLeavesGradientsAlone) {
  auto p = params_with_grads();
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(p, 100.0, 2.0).item<double>(), 13.0);
  EXPECT_EQ(p[1].grad().to_vector<float>()[0], 12.0f);
}

TEST(ClipGrad, OneAndInfinityNorms) {
  auto p = params_with_grads();
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(p, 1000.0, 1.0).item<double>(), 19.0);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_DOUBLE_EQ(optim::clip_grad_norm_(p, 6.0, inf).item<double>(), 12.0);
  EXPECT_FLOAT_EQ(p[1].grad().to_vector<float>()[0], static_cast<float>(12 * (6.0 / (12.0 + 1e-6))));
}

// The device way (foreach; the default for CUDA gradients) run on the host: the same norm and the
// same clipped gradients as the host way, to float32 rounding, for the 2-, 1- and inf-norms; the
// norm comes back as a float32 tensor on the gradients' device, unread.
TEST(ClipGrad, DeviceWayMatchesHostWay) {
  const double inf = std::numeric_limits<double>::infinity();
  for (double norm_type : {2.0, 1.0, 3.0, inf}) {
    SCOPED_TRACE(norm_type);
    auto host = params_with_grads(), dev = params_with_grads();
    const Tensor h = optim::clip_grad_norm_(host, 5.0, norm_type, /*foreach=*/false);
    const Tensor d = optim::clip_grad_norm_(dev, 5.0, norm_type, /*foreach=*/true);
    EXPECT_EQ(h.dtype(), kFloat64);
    EXPECT_EQ(d.dtype(), kFloat32);
    EXPECT_EQ(d.dim(), 0);
    EXPECT_NEAR(d.item<double>(), h.item<double>(), 1e-5 * h.item<double>());
    for (int i = 0; i < 2; ++i) {
      const auto hv = host[i].grad().to_vector<float>(), dv = dev[i].grad().to_vector<float>();
      ASSERT_EQ(hv.size(), dv.size());
      for (size_t j = 0; j < hv.size(); ++j) EXPECT_NEAR(dv[j], hv[j], 1e-5f * std::fabs(hv[j]));
    }
    EXPECT_FALSE(dev[2].grad().defined());
  }
}

// Below max_norm the device way multiplies by exactly 1: the gradients keep their bits.
TEST(ClipGrad, DeviceWayBelowMaxNormKeepsGradients) {
  auto p = params_with_grads();
  EXPECT_FLOAT_EQ(optim::clip_grad_norm_(p, 100.0, 2.0, /*foreach=*/true).item<float>(), 13.0f);
  EXPECT_EQ(p[0].grad().to_vector<float>(), (std::vector<float>{3, -4}));
  EXPECT_EQ(p[1].grad().to_vector<float>(), (std::vector<float>{12}));
}

TEST(ClipGrad, RefusesBadArguments) {
  auto p = params_with_grads();
  EXPECT_THROW(optim::clip_grad_norm_(p, 0.0, 2.0), Error);
  EXPECT_THROW(optim::clip_grad_norm_(p, 1.0, 0.5), Error);
}

}  // namespace
}  // namespace tandem
