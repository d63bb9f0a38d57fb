// Parity of nn::functional ops with PyTorch 1.13: forward outputs, gradients and BatchNorm running
// statistics against tests/fixtures/ops.safetensors (made by tests/fixtures/make_fixtures.py; its
// docstring lists every case and tensor name).
// Assumes: the fixture's references are float64 results rounded to float32, and each grad_<input>
// is d sum(y * R) / d input, so y.backward(R) must reproduce it.
// Tolerance: |actual - expected| <= 1e-5 + 1e-4 |expected| per element. The references are exact
// to half an ulp, so the budget only has to cover Tandem's own float32 rounding. The longest
// reduction here is conv grad_w over N*Ho*Wo = 40 products of O(1) terms: a float32 sum carries at
// most ~40 * 6e-8 * sum|terms| ~ 1e-5 absolute error and typically sqrt(40) times less. PyTorch's
// own float32 results use at most 1.4% of this budget (make_fixtures.py prints that), while any
// indexing, padding or formula error gives errors of order 1e-2..1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"
#include "nn/functional.h"

namespace {

using namespace tandem;
namespace Fn = tandem::nn::functional;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

const TensorMap& fixture() {
  static const TensorMap map = load_safetensors(TANDEM_SOURCE_DIR "/tests/fixtures/ops.safetensors");
  return map;
}

// The fixture tensor `name`, as a fresh copy (so tests never alias each other's data).
Tensor get(const std::string& name) {
  auto it = fixture().find(name);
  TANDEM_CHECK(it != fixture().end(), "ops.safetensors has no tensor '", name,
               "'; regenerate it with tests/fixtures/make_fixtures.py");
  return it->second.clone();
}

Tensor leaf(const std::string& name) {
  Tensor t = get(name);
  t.set_requires_grad(true);
  return t;
}

// Element-wise |a - e| <= atol + rtol |e|, reporting the count and the worst element.
void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what,
                  double atol = kAtol, double rtol = kRtol) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined (no gradient flowed?)";
  ASSERT_EQ(shape_str(actual.shape()), shape_str(expected.shape())) << what << ": shape";
  const std::vector<float> a = actual.to_vector<float>();
  const std::vector<float> e = expected.to_vector<float>();
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < e.size(); ++i) {
    const double err = std::abs(static_cast<double>(a[i]) - e[i]);
    const double ratio = err / (atol + rtol * std::abs(static_cast<double>(e[i])));
    if (!(ratio <= 1.0)) ++bad;  // also counts NaN
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << e.size() << " elements outside "
                     << atol << " + " << rtol << "|ref|; worst at flat index " << worst
                     << ": got " << a[worst] << ", PyTorch " << e[worst] << " (" << worst_ratio
                     << "x the tolerance)";
}

// Runs fn on leaves made from "<c>.<input>" for every input, back-propagates "<c>.R", and checks
// "<c>.y" and "<c>.grad_<input>" for each input in `grads`.
void check_case(const std::string& c, const std::vector<std::string>& grads,
                const std::vector<std::string>& others,
                const std::function<Tensor(std::map<std::string, Tensor>&)>& fn) {
  SCOPED_TRACE("case " + c);
  std::map<std::string, Tensor> in;
  for (const auto& g : grads) in[g] = leaf(c + "." + g);
  for (const auto& o : others) in[o] = get(c + "." + o);
  Tensor y = fn(in);
  expect_close(y, get(c + ".y"), c + ".y");
  ASSERT_TRUE(y.requires_grad()) << c << ": output does not require grad";
  y.backward(get(c + ".R"));
  for (const auto& g : grads) expect_close(in[g].grad(), get(c + ".grad_" + g), c + ".grad_" + g);
}

TEST(PytorchOps, FixtureIsReadable) {
  // Guards the fixture itself: known shapes and dtypes, so a stale file fails here first.
  EXPECT_EQ(shape_str(get("conv_s2p1.x").shape()), "[2, 3, 7, 6]");
  EXPECT_EQ(shape_str(get("conv_s2p1.y").shape()), "[2, 4, 4, 3]");
  EXPECT_EQ(shape_str(get("conv_s1p0.y").shape()), "[2, 4, 5, 4]");
  EXPECT_EQ(shape_str(get("maxpool_k3s2p1.y").shape()), "[2, 3, 4, 3]");
  EXPECT_EQ(get("nll.target").dtype(), kInt64);
  EXPECT_EQ(get("nll.loss").numel(), 1);
}

TEST(PytorchOps, Conv2dStride1Pad0) {
  check_case("conv_s1p0", {"x", "w", "b"}, {}, [](auto& in) {
    return Fn::conv2d(in["x"], in["w"], in["b"], /*stride=*/1, /*padding=*/0);
  });
}

TEST(PytorchOps, Conv2dStride2Pad1) {
  check_case("conv_s2p1", {"x", "w", "b"}, {}, [](auto& in) {
    return Fn::conv2d(in["x"], in["w"], in["b"], /*stride=*/2, /*padding=*/1);
  });
}

TEST(PytorchOps, BatchNormTrainingAndRunningStats) {
  Tensor running_mean = get("bn_train.running_mean_in");
  Tensor running_var = get("bn_train.running_var_in");
  EXPECT_EQ(running_mean.to_vector<float>(), std::vector<float>(3, 0.0f));
  EXPECT_EQ(running_var.to_vector<float>(), std::vector<float>(3, 1.0f));
  check_case("bn_train", {"x", "weight", "bias"}, {}, [&](auto& in) {
    return Fn::batch_norm(in["x"], running_mean, running_var, in["weight"], in["bias"],
                          /*training=*/true, /*momentum=*/0.1, /*eps=*/1e-5);
  });
  // (1 - 0.1) * 0 + 0.1 * batch mean, and (1 - 0.1) * 1 + 0.1 * unbiased batch variance (80 / 79).
  expect_close(running_mean, get("bn_train.running_mean"), "bn_train.running_mean");
  expect_close(running_var, get("bn_train.running_var"), "bn_train.running_var");
}

TEST(PytorchOps, BatchNormEvalUsesRunningStats) {
  Tensor running_mean = get("bn_eval.running_mean");
  Tensor running_var = get("bn_eval.running_var");
  check_case("bn_eval", {"x", "weight", "bias"}, {}, [&](auto& in) {
    return Fn::batch_norm(in["x"], running_mean, running_var, in["weight"], in["bias"],
                          /*training=*/false, /*momentum=*/0.1, /*eps=*/1e-5);
  });
  // Eval must leave the running statistics untouched.
  EXPECT_EQ(running_mean.to_vector<float>(), get("bn_eval.running_mean").to_vector<float>());
  EXPECT_EQ(running_var.to_vector<float>(), get("bn_eval.running_var").to_vector<float>());
}

TEST(PytorchOps, Relu) {
  check_case("relu", {"x"}, {}, [](auto& in) { return Fn::relu(in["x"]); });
}

TEST(PytorchOps, MaxPoolKernel2Stride2) {
  // 7x6 input: floor mode drops the last row.
  check_case("maxpool_k2s2", {"x"}, {}, [](auto& in) { return Fn::max_pool2d(in["x"], 2); });
}

TEST(PytorchOps, MaxPoolKernel3Stride2Pad1) {
  // Overlapping windows: an element that is the max of two windows gets both gradients.
  check_case("maxpool_k3s2p1", {"x"}, {},
             [](auto& in) { return Fn::max_pool2d(in["x"], 3, /*stride=*/2, /*padding=*/1); });
}

TEST(PytorchOps, Linear) {
  check_case("linear", {"x", "w", "b"}, {},
             [](auto& in) { return Fn::linear(in["x"], in["w"], in["b"]); });
}

TEST(PytorchOps, LogSoftmax) {
  check_case("log_softmax", {"x"}, {}, [](auto& in) { return Fn::log_softmax(in["x"], 1); });
}

TEST(PytorchOps, LogSoftmaxThenNllLoss) {
  Tensor x = leaf("nll.x");
  Tensor target = get("nll.target");
  Tensor log_probs = Fn::log_softmax(x, 1);
  expect_close(log_probs, get("nll.log_probs"), "nll.log_probs");
  Tensor loss = Fn::nll_loss(log_probs, target);
  expect_close(loss, get("nll.loss"), "nll.loss");
  loss.backward();
  expect_close(x.grad(), get("nll.grad_x"), "nll.grad_x");
}

TEST(PytorchOps, NllLossGradientIsMinusOneOverNAtTargets) {
  Tensor log_probs = leaf("nll.log_probs");
  Tensor loss = Fn::nll_loss(log_probs, get("nll.target"));
  expect_close(loss, get("nll.loss"), "nll.loss from log_probs");
  loss.backward();
  expect_close(log_probs.grad(), get("nll.grad_log_probs"), "nll.grad_log_probs");
}

}  // namespace
