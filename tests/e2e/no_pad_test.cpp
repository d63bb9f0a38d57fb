// tandem-mnist --no-pad (MMEngine's sampler round_up=False) under tandem-run: an odd number of
// training samples over 2 ranks, so rank 0 has one batch more; the run finishes (rank 1 shadows
// rank 0's last iteration under dist::Join), every sample counts once, and the bad combinations
// are one-line errors. The arithmetic of Join is proved in tests/dist/join_test.cpp.
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

int run_two_ranks(std::vector<std::string> flags, const fs::path& log) {
  std::vector<std::string> argv = {kRun,     "--nproc-per-node", "2",      "--master-port", std::to_string(free_port()),
                                   kTrainer, "--launcher",       "pytorch"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return run_process(argv, log);
}

}  // namespace

TEST(NoPad, UnevenSharesFinishAndEverySampleCountsOnce) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("no-pad");
  const fs::path metrics = tmp / "m.jsonl", log = tmp / "run.log";
  const int rc = run_two_ranks({"--data-dir", kDigits, "--limit", "6401", "--epochs", "1", "--no-pad", "--threads",
                                "1", "--device", "cpu", "--work-dir", (tmp / "work").string(), "--metrics-out",
                                metrics.string(), "--test-limit", "500"},
                               log);
  ASSERT_EQ(rc, 0) << read_file(log);
  int64_t train_iters = 0, samples = -1;
  double accuracy = -1;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    if (r["type"] == "train") ++train_iters;
    if (r["type"] == "epoch") samples = r["samples"].get<int64_t>();
    if (r["type"] == "eval") accuracy = r["test_accuracy"].get<double>();
  }
  EXPECT_EQ(train_iters, 51);  // rank 0: 3201 samples in batches of 64
  EXPECT_EQ(samples, 6401);
  // Evaluated (not judged: rank 0's last batch holds one image, which BatchNorm's running
  // statistics take badly, padded or not).
  EXPECT_GE(accuracy, 0.0) << read_file(log);
}

TEST(NoPad, WithSyncBatchNormIsOneLineError) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("no-pad-syncbn");
  const fs::path log = tmp / "run.log";
  const int rc = run_two_ranks({"--data-dir", kDigits, "--limit", "640", "--no-pad", "--sync-bn", "--threads", "1",
                                "--device", "cpu", "--work-dir", (tmp / "work").string()},
                               log);
  EXPECT_NE(rc, 0);
  const std::string out = read_file(log);
  EXPECT_NE(out.find("round_up false (--no-pad) cannot be combined with SyncBatchNorm"), std::string::npos) << out;
}
