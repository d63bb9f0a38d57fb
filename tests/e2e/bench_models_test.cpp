// bench/compare_models.py end to end on tiny runs (2 timed steps after 1, one repeat, 1 thread):
// Tandem's bench/model_steps against bench/pytorch_models.py for both example models. Checks what
// must hold whatever the speed: both sides built the same networks (equal parameter counts, the
// examples' 68,642 and 110,528), the GPT's loss before any update is near ln(vocabulary) on both
// sides (the tied N(0, 0.02) embedding starts near uniform), every number is positive and the
// ratios are the quotients of the reported numbers; --amp bf16 reaches both sides. Nothing is timed. Without the bench targets
// (TANDEM_BUILD_BENCH=OFF) the script runs PyTorch on both sides. Bad --models names the valid ones.
// Assumes: /usr/bin/python3 with PyTorch 1.13 (scripts/setup.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace tandem;

const std::string kPython = "/usr/bin/python3";
const std::string kCompareModels = TANDEM_SOURCE_DIR "/bench/compare_models.py";

std::vector<std::string> compare_models(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {kPython, kCompareModels, "--iters", "2", "--warmup", "1", "--repeats", "1",
                                   "--threads", "1", "--timeout", "300"};
#ifdef TANDEM_MODEL_STEPS
  argv.insert(argv.end(), {"--tandem-bin", TANDEM_MODEL_STEPS});
#else
  argv.push_back("--pytorch-both");
#endif
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(BenchScripts, CompareModelsRunsBothModelsOnBothSidesWithEqualNetworks) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  test::TempDir tmp("bench_models");
  const fs::path out = tmp / "models.json", log = tmp / "log";
  const int rc = test::run_process(compare_models({"--json-out", out}), log);
  ASSERT_EQ(rc, 0) << test::read_file(log);
  const std::string text = test::read_file(log);
  EXPECT_NE(text.find("| resnet | 1 |"), std::string::npos) << text;
  EXPECT_NE(text.find("| gpt | 1 |"), std::string::npos) << text;

  const json j = json::parse(test::read_file(out));
  const json& res = j.at("results");
  ASSERT_EQ(res.size(), 2u) << res.dump(1);
  const std::vector<std::pair<std::string, int64_t>> expected = {{"resnet", 68642}, {"gpt", 110528}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const json& r = res[i];
    SCOPED_TRACE(expected[i].first);
    EXPECT_EQ(r.at("model"), expected[i].first);
    EXPECT_EQ(r.at("threads"), 1);
    const json &t = r.at("tandem"), &p = r.at("pytorch");
    EXPECT_EQ(t.at("params").get<int64_t>(), expected[i].second);
    EXPECT_EQ(p.at("params").get<int64_t>(), expected[i].second);
    for (const json* side : {&t, &p}) {
      ASSERT_EQ(side->at("runs").size(), 1u);
      const json& run = side->at("runs")[0];
      EXPECT_EQ(run.at("iters"), 2);
      EXPECT_EQ(run.at("warmup"), 1);
      EXPECT_GT(run.at("seconds").get<double>(), 0);
      EXPECT_NEAR(run.at("samples_per_s").get<double>(),
                  run.at("batch_size").get<double>() * 2 / run.at("seconds").get<double>(), 1e-6);
      EXPECT_GT(side->at("peak_rss_bytes").get<double>(), 0);
      EXPECT_TRUE(std::isfinite(run.at("last_loss").get<double>()));
      if (expected[i].first == "gpt") {
        EXPECT_NEAR(run.at("first_loss").get<double>(), std::log(99.0), 0.05);
      }
    }
    EXPECT_NEAR(r.at("ratio_samples_per_s").get<double>(),
                t.at("samples_per_s").get<double>() / p.at("samples_per_s").get<double>(), 1e-9);
    EXPECT_NEAR(r.at("ratio_peak_rss").get<double>(),
                t.at("peak_rss_bytes").get<double>() / p.at("peak_rss_bytes").get<double>(), 1e-9);
  }
}

// --amp bf16 reaches both sides: each run says so, and the GPT's first loss (before any update) is still
// near ln(vocabulary) with bfloat16 logits.
TEST(BenchScripts, CompareModelsAmpRunsBothSidesUnderAutocast) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  test::TempDir tmp("bench_models");
  const fs::path out = tmp / "models.json", log = tmp / "log";
  const int rc = test::run_process(compare_models({"--models", "gpt", "--amp", "bf16", "--json-out", out}), log);
  ASSERT_EQ(rc, 0) << test::read_file(log);
  EXPECT_NE(test::read_file(log).find("amp bf16"), std::string::npos) << test::read_file(log);
  const json res = json::parse(test::read_file(out)).at("results");
  ASSERT_EQ(res.size(), 1u) << res.dump(1);
  for (const char* side : {"tandem", "pytorch"}) {
    SCOPED_TRACE(side);
    const json& run = res[0].at(side).at("runs").at(0);
    EXPECT_EQ(run.at("amp"), "bf16");
    EXPECT_NEAR(run.at("first_loss").get<double>(), std::log(99.0), 0.05);
    EXPECT_TRUE(std::isfinite(run.at("last_loss").get<double>()));
  }
}

TEST(BenchScripts, CompareModelsRefusesFloat16OnTheCpuWherePyTorchHasNoPeer) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  test::TempDir tmp("bench_models");
  const fs::path log = tmp / "log";
  const int rc = test::run_process(compare_models({"--amp", "fp16"}), log);
  const std::string text = test::read_file(log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(text.find("--amp fp16 needs --device cuda"), std::string::npos) << text;
}

TEST(BenchScripts, CompareModelsRejectsAnUnknownModelNamingTheValidOnes) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  test::TempDir tmp("bench_models");
  const fs::path log = tmp / "log";
  const int rc = test::run_process(compare_models({"--models", "resnet,vgg"}), log);
  const std::string text = test::read_file(log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(text.find("unknown vgg"), std::string::npos) << text;
  EXPECT_NE(text.find("resnet,gpt"), std::string::npos) << text;
}

}  // namespace
