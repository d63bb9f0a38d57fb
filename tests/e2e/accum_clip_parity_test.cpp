// Gradient accumulation and clipping against PyTorch: tandem-mnist with
// optim_wrapper.accumulative_counts and optim_wrapper.clip_grad (through --cfg-options, MMEngine's
// keys) for 50 iterations from the weights PyTorch started from, compared with
// tests/fixtures/accum_clip_losses.json (made by tests/fixtures/make_accum_fixtures.py: MMEngine's
// OptimWrapper loop in real PyTorch 1.13, one process): every iteration's loss, every update's
// total gradient norm before clipping (clip_grad_norm_'s return value, logged as grad_norm on the
// iterations that step), the number of updates, and the final eval. Tolerances come from the
// fixture, each >= 2x the drift PyTorch shows against itself (threads, oneDNN, 1-ulp weights).
// Skips when Fashion-MNIST is absent (TANDEM_FASHION_MNIST_DIR overrides its place).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"
#include "metrics.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tandem::test::rel;

std::string data_dir() {
  const char* env = std::getenv("TANDEM_FASHION_MNIST_DIR");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

// The grad_norm of every train line that has one (the iterations that stepped), in order.
std::vector<double> grad_norms(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == "train" && j.contains("grad_norm"))
      out.push_back(j["grad_norm"].get<double>());
  }
  return out;
}

void check_rows(const json& rows, const std::vector<double>& got, const std::vector<double>& ref,
                const std::string& what) {
  for (const auto& row : rows) {
    const int first = row.at(0).get<int>(), last = row.at(1).get<int>();
    const double rtol = row.at(2).get<double>();
    for (int k = first; k <= last; ++k)
      EXPECT_LE(rel(got[k - 1], ref[k - 1]), rtol)
          << what << " " << k << ": tandem " << got[k - 1] << ", PyTorch " << ref[k - 1];
  }
}

void check_recipe(const std::string& name) {
  const std::string dir = data_dir();
  TANDEM_NEED_DATA(dir);
  std::ifstream in(TANDEM_SOURCE_DIR "/tests/fixtures/accum_clip_losses.json");
  ASSERT_TRUE(in) << "tests/fixtures/accum_clip_losses.json is missing";
  const json fixture = json::parse(in);
  json recipe;
  for (const auto& r : fixture.at("recipes"))
    if (r.at("name") == name) recipe = r;
  ASSERT_FALSE(recipe.is_null()) << name;
  const int steps = fixture.at("steps").get<int>(), batch = fixture.at("batch_size").get<int>();
  tandem::test::TempDir tmp("accum");
  const fs::path metrics = tmp / "m.jsonl";
  std::vector<std::string> argv = {tandem::test::kTrainer, "--init-weights",
                                   TANDEM_SOURCE_DIR "/tests/fixtures/mnist_init.safetensors", "--no-shuffle",
                                   "--limit", std::to_string(steps * batch), "--epochs", "1", "--batch-size",
                                   std::to_string(batch), "--test-limit",
                                   std::to_string(fixture.at("test_samples").get<int>()), "--threads", "1",
                                   "--device", "cpu", "--metrics-out", metrics.string(), "--data-dir", dir,
                                   "--work-dir", tmp.file("w")};
  for (const auto& f : recipe.at("tandem_flags")) argv.push_back(f.get<std::string>());
  ASSERT_EQ(tandem::test::run_process(argv, tmp / "log"), 0) << tandem::test::read_file(tmp / "log");

  tandem::test::Metrics m;
  ASSERT_NO_FATAL_FAILURE(tandem::test::read_metrics(metrics, m));
  const auto ref = recipe.at("losses").get<std::vector<double>>();
  const auto ref_norms = recipe.at("grad_norms").get<std::vector<double>>();
  ASSERT_EQ(m.losses.size(), ref.size());
  const std::vector<double> norms = grad_norms(metrics);
  ASSERT_EQ(norms.size(), ref_norms.size()) << "one grad_norm per update (the last group is short)";
  const json& tol = recipe.at("tolerance");
  check_rows(tol.at("per_step_rtol"), m.losses, ref, name + " iteration");
  check_rows(tol.at("grad_norm_rtol"), norms, ref_norms, name + " update");
  int clipped = 0;
  const double max_norm = recipe.at("clip_grad").at("max_norm").get<double>();
  for (double n : norms) clipped += n > max_norm;
  EXPECT_GT(clipped, 0) << "the recipe must clip some updates";
  EXPECT_LT(clipped, static_cast<int>(norms.size())) << "and leave some alone";
  ASSERT_FALSE(m.eval.is_null());
  EXPECT_LE(rel(m.eval.at("test_loss").get<double>(), recipe.at("eval").at("test_loss").get<double>()),
            tol.at("eval").at("test_loss_rtol").get<double>());
  EXPECT_LE(std::abs(m.eval.at("test_accuracy").get<double>() - recipe.at("eval").at("test_accuracy").get<double>()),
            tol.at("eval").at("test_accuracy_atol").get<double>());
}

TEST(AccumClipParity, SgdAccumulateThreeClipTwoNormMatchesPytorch) { check_recipe("sgd_accum3_clip"); }

TEST(AccumClipParity, AdadeltaAccumulateFourClipOneNormMatchesPytorch) { check_recipe("adadelta_accum4_clip_l1"); }

}  // namespace
