// End-to-end parity with PyTorch: runs the tandem-mnist binary for 50 steps (batch 64, unshuffled,
// the first 3200 Fashion-MNIST images, one thread) from the same initial weights PyTorch used, and
// compares the per-iteration training losses and the final eval with tests/fixtures/mnist_losses.json
// (made by tests/fixtures/make_fixtures.py, which records the recipe next to the numbers).
// Assumes: <build>/apps/tandem-mnist exists and takes the flags listed in the fixture README;
// Fashion-MNIST is in /usr/share/datasets/fashion-mnist (or $TANDEM_FASHION_MNIST_DIR), else the
// tests skip. Links nlohmann_json (tests/CMakeLists.txt).
// Tolerances come from the fixture (per recipe): tight for the first steps, where PyTorch's own
// float32 drift (threads, oneDNN on/off, 1-ulp weight changes) is <= 1e-5 relative, then growing
// with the drift PyTorch shows by itself (chaotic for Adadelta lr 1.0); each is >= 2x that drift.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "metrics.h"
#include "common/process.h"
#include "common/test_util.h"
#include "common/require_data.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string data_dir() {
  const char* env = std::getenv("TANDEM_FASHION_MNIST_DIR");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

json load_fixture() {
  std::ifstream in(TANDEM_SOURCE_DIR "/tests/fixtures/mnist_losses.json");
  if (!in) throw std::runtime_error("cannot open tests/fixtures/mnist_losses.json");
  return json::parse(in);
}

std::string tail(const fs::path& file, size_t max_chars = 3000) {
  const std::string s = tandem::test::read_file(file);
  return s.size() > max_chars ? "..." + s.substr(s.size() - max_chars) : s;
}

using tandem::test::mean;
using tandem::test::rel;

void check_recipe(const std::string& name) {
  const std::string dir = data_dir();
  TANDEM_NEED_DATA(dir);  // (or set TANDEM_FASHION_MNIST_DIR)
  const std::string binary = TANDEM_BINARY_DIR "/apps/tandem-mnist";
  ASSERT_TRUE(fs::exists(binary)) << binary << " is missing: build the tandem-mnist target";

  const json fixture = load_fixture();
  json recipe;
  for (const auto& r : fixture.at("recipes"))
    if (r.at("name") == name) recipe = r;
  ASSERT_FALSE(recipe.is_null()) << "recipe " << name << " not in mnist_losses.json";
  const int steps = fixture.at("steps").get<int>();
  const std::vector<double> ref = recipe.at("losses").get<std::vector<double>>();
  ASSERT_EQ(static_cast<int>(ref.size()), steps);

  const fs::path tmp = fs::temp_directory_path() /
                       ("tandem_parity_" + name + "_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  const fs::path metrics = tmp / "metrics.jsonl", log = tmp / "log.txt";
  std::vector<std::string> argv = {
      binary,          "--init-weights", TANDEM_SOURCE_DIR "/tests/fixtures/mnist_init.safetensors",
      "--no-shuffle",  "--limit",        std::to_string(steps * fixture.at("batch_size").get<int>()),
      "--epochs",      "1",              "--batch-size", std::to_string(fixture.at("batch_size").get<int>()),
      "--test-limit",  std::to_string(fixture.at("data").at("test_samples").get<int>()),
      "--threads",     "1",              "--device",     "cpu",
      "--metrics-out", metrics.string(), "--data-dir",   dir};
  for (const auto& f : recipe.at("tandem_flags")) argv.push_back(f.get<std::string>());
  std::string cmd;
  for (const auto& a : argv) cmd += a + " ";
  SCOPED_TRACE("command: " + cmd);

  const int rc = tandem::test::run_process(argv, log);
  ASSERT_EQ(rc, 0) << "tandem-mnist failed; its output:\n" << tail(log);

  // ---- parse the metrics JSON lines ----
  tandem::test::Metrics m;
  ASSERT_NO_FATAL_FAILURE(tandem::test::read_metrics(metrics, m));
  for (double lr : m.lrs) EXPECT_LE(rel(lr, recipe.at("lr").get<double>()), 1e-6);
  const std::vector<double>& losses = m.losses;
  const json& epoch_line = m.epoch;
  const json& eval_line = m.eval;
  ASSERT_EQ(static_cast<int>(losses.size()), steps) << "train lines in " << metrics;
  ASSERT_FALSE(epoch_line.is_null()) << "no epoch line in " << metrics;
  EXPECT_EQ(epoch_line.at("samples").get<int64_t>(), steps * fixture.at("batch_size").get<int64_t>());

  // ---- per-step losses ----
  const json& tol = recipe.at("tolerance");
  for (const auto& row : tol.at("per_step_rtol")) {
    const int first = row.at(0).get<int>(), last = row.at(1).get<int>();
    const double rtol = row.at(2).get<double>();
    for (int k = first; k <= last; ++k) {
      EXPECT_TRUE(std::isfinite(losses[k - 1])) << "step " << k;
      EXPECT_LE(rel(losses[k - 1], ref[k - 1]), rtol)
          << name << " step " << k << ": tandem " << losses[k - 1] << ", PyTorch " << ref[k - 1];
    }
  }
  // ---- means over windows of steps ----
  for (const auto& row : tol.at("window_mean_rtol")) {
    const int first = row.at(0).get<int>(), last = row.at(1).get<int>();
    const double rtol = row.at(2).get<double>();
    const double t = mean(losses, first, last), p = mean(ref, first, last);
    EXPECT_LE(rel(t, p), rtol) << name << " mean loss over steps " << first << "-" << last
                               << ": tandem " << t << ", PyTorch " << p;
  }
  // ---- eval after the 50 steps ----
  ASSERT_FALSE(eval_line.is_null()) << "no eval line in " << metrics;
  const double test_loss = eval_line.at("test_loss").get<double>();
  const double acc = eval_line.at("test_accuracy").get<double>();
  const double ref_loss = recipe.at("eval").at("test_loss").get<double>();
  const double ref_acc = recipe.at("eval").at("test_accuracy").get<double>();
  EXPECT_LE(rel(test_loss, ref_loss), tol.at("eval").at("test_loss_rtol").get<double>())
      << name << " test_loss: tandem " << test_loss << ", PyTorch " << ref_loss;
  EXPECT_LE(std::abs(acc - ref_acc), tol.at("eval").at("test_accuracy_atol").get<double>())
      << name << " test_accuracy: tandem " << acc << ", PyTorch " << ref_acc;

  if (!::testing::Test::HasFailure()) fs::remove_all(tmp);
}

TEST(PytorchParity, AdadeltaLossesMatchPytorch) { check_recipe("adadelta"); }

TEST(PytorchParity, SgdMomentumLossesMatchPytorch) { check_recipe("sgd_momentum"); }

}  // namespace
