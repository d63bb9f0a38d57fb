// log_softmax and nll_loss on CUDA against the CPU kernels, forward and backward, with large and
// shifted logits, several class counts; and the out-of-range target, which the CUDA kernel
// reports at the next read of a result from the device, naming the row and the value.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/ops.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "kernels/loss.h"

// The cuda:: kernels exist only in builds with the CUDA backend; without it this file is empty
// (and every GPU test would skip anyway).
#ifdef TANDEM_WITH_CUDA

using namespace tandem;
using namespace tandem::gpu_test;
namespace kc = tandem::kernels::cuda;
namespace kp = tandem::kernels::cpu;

namespace {

Tensor random_targets(int64_t N, int64_t C, Generator& gen) {
  std::vector<int64_t> t(N);
  for (auto& v : t) v = static_cast<int64_t>(gen.below(C));
  return Tensor::from_vector<int64_t>(t, {N});
}

}  // namespace

TEST(CudaLogSoftmax, MatchesCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(1);
  for (auto [N, C, lo, hi] : {std::tuple<int64_t, int64_t, double, double>{64, 10, -5, 5},
                              {3, 1, -1, 1},
                              {7, 100, 50, 80},  // large logits: the max shift matters
                              {5, 1000, -30, 30}}) {
    SCOPED_TRACE(::testing::Message() << N << "x" << C);
    const Tensor x = random_cpu({N, C}, gen, lo, hi);
    const Tensor y_ref = kp::log_softmax_forward(x);
    const Tensor y = kc::log_softmax_forward(x.to(gpu()));
    EXPECT_TRUE(close(y, y_ref, 1e-5, 1e-5));
    const Tensor g = random_cpu({N, C}, gen);
    EXPECT_TRUE(close(kc::log_softmax_backward(g.to(gpu()), y), kp::log_softmax_backward(g, y_ref), 1e-5, 1e-4));
  }
}

TEST(CudaNllLoss, MatchesCpu) {
  TANDEM_NEED_GPUS(1);
  Generator gen(2);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{64, 10}, {1, 3}, {300, 7}}) {
    SCOPED_TRACE(::testing::Message() << N << "x" << C);
    const Tensor lp = kp::log_softmax_forward(random_cpu({N, C}, gen, -3, 3));
    const Tensor t = random_targets(N, C, gen);
    const Tensor loss_ref = kp::nll_loss_forward(lp, t);
    const Tensor loss = kc::nll_loss_forward(lp.to(gpu()), t.to(gpu()));
    EXPECT_EQ(loss.dim(), 0);
    EXPECT_TRUE(close(loss, loss_ref, 1e-6, 1e-5));
    const Tensor grad = Tensor::full({}, 0.7);
    EXPECT_TRUE(close(kc::nll_loss_backward(grad.to(gpu()), lp.to(gpu()), t.to(gpu())),
                      kp::nll_loss_backward(grad, lp, t), 1e-7, 1e-6));
  }
}

TEST(CudaNllLoss, OutOfRangeTargetIsReportedWhenTheLossIsRead) {
  TANDEM_NEED_GPUS(1);
  Generator gen(3);
  const Tensor lp = kp::log_softmax_forward(random_cpu({6, 10}, gen)).to(gpu());
  const Tensor bad = Tensor::from_vector<int64_t>({1, 2, 3, 12, 4, 5}, {6}).to(gpu());
  const Tensor loss = kc::nll_loss_forward(lp, bad);
  EXPECT_TRUE(throws_with([&] { (void)loss.item<float>(); }, {"nll_loss", "12", "row 3", "[0, 10)"}));
  // The report is consumed: correct targets work again, and a negative one is caught too.
  const Tensor good = Tensor::from_vector<int64_t>({1, 2, 3, 9, 4, 5}, {6}).to(gpu());
  EXPECT_TRUE(std::isfinite(kc::nll_loss_forward(lp, good).item<float>()));
  const Tensor negative = Tensor::from_vector<int64_t>({0, 0, 0, 0, -1, 0}, {6}).to(gpu());
  const Tensor grad = kc::nll_loss_backward(Tensor::ones({}, kFloat32, gpu()), lp, negative);
  EXPECT_TRUE(throws_with([&] { (void)grad.to(Device::cpu()); }, {"-1", "row 4"}));
}

#endif  // TANDEM_WITH_CUDA
