// MMEngine-style logs and pictures: the progress line carries base_lr and memory, the work dir
// keeps vis_data/scalars.json (JSON lines, one per progress line and validation), and
// tools/analyze_logs.py plot_curve draws several runs' loss, lr and accuracy into one PNG.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

using namespace tandem::test;
namespace fs = std::filesystem;

namespace {

const std::string kAnalyze = TANDEM_SOURCE_DIR "/tools/analyze_logs.py";

fs::path train(const TempDir& tmp, const std::string& seed) {
  const fs::path work = tmp / ("run" + seed), log = tmp / ("run" + seed + ".log");
  const int rc = run_process({kTrainer, "--data-dir", kDigits, "--limit", "640", "--test-limit", "200", "--epochs", "2",
                              "--log-interval", "5", "--seed", seed, "--threads", "1", "--device", "cpu",
                              "--work-dir", work.string()},
                             log);
  EXPECT_EQ(rc, 0) << read_file(log);
  const std::string out = read_file(log);
  EXPECT_NE(out.find("base_lr: 1.0000e+00 lr: 7.0000e-01"), std::string::npos) << out;  // epoch 2, StepLR 0.7
  EXPECT_NE(out.find(" memory: "), std::string::npos) << out;
  return work / "vis_data" / "scalars.json";
}

}  // namespace

TEST(VisData, ScalarsJsonAndPlotCurveOfTwoRuns) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("vis-data");
  const fs::path a = train(tmp, "1"), b = train(tmp, "2");
  ASSERT_TRUE(fs::exists(a));
  int progress = 0, vals = 0;
  std::ifstream in(a);
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    if (r.contains("loss")) {
      ++progress;
      for (const char* k : {"base_lr", "lr", "memory", "time", "data_time", "step"}) EXPECT_TRUE(r.contains(k)) << line;
      EXPECT_GT(r["memory"].get<int64_t>(), 0) << line;
    }
    if (r.contains("accuracy")) ++vals;
  }
  EXPECT_EQ(progress, 4);  // 10 iterations an epoch, a line every 5, 2 epochs
  EXPECT_EQ(vals, 2);

  const fs::path png = tmp / "curves.png";
  const int rc = run_process({"/usr/bin/python3", kAnalyze, "plot_curve", a.string(), b.string(), "--keys", "loss",
                              "lr", "accuracy", "--legend", "seed1", "seed2", "--out", png.string()},
                             tmp / "plot.log");
  ASSERT_EQ(rc, 0) << read_file(tmp / "plot.log");
  const std::string bytes = read_file(png);
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));

  const int bad = run_process({"/usr/bin/python3", kAnalyze, "plot_curve", a.string(), "--keys", "nope", "--out",
                               (tmp / "x.png").string()},
                              tmp / "bad.log");
  EXPECT_EQ(bad, 2);
  expect_one_line_error(read_file(tmp / "bad.log"), "no file has key 'nope'");
}
