// Resume on a changed world size (train::RunnerOptions::reshard_resume, tandem-mnist --resume-reshard):
// a 2-rank run killed after a mid-epoch checkpoint is resumed by one process. The samples the
// checkpoint's epoch consumed stay consumed, the rest of that epoch is visited exactly once, and the
// next epoch is a whole one. Without the flag the checkpoint is refused with a clear message. The
// samples each rank trained on come from the test hook --debug-samples-out ("epoch iter index..."
// per batch). 640 samples, batch 64: 5 iterations an epoch on 2 ranks, 10 on one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

// epoch -> the indices trained on in that epoch, over the iterations <= max_iter of `files`.
std::map<int, std::vector<int64_t>> samples(const std::vector<fs::path>& files, int max_iter = 1 << 30) {
  std::map<int, std::vector<int64_t>> out;
  for (const fs::path& f : files) {
    std::ifstream in(f);
    for (std::string line; std::getline(in, line);) {
      std::istringstream items(line);
      int epoch = 0, iter = 0;
      items >> epoch >> iter;
      for (int64_t i; items >> i;)
        if (iter <= max_iter) out[epoch].push_back(i);
    }
  }
  return out;
}

// The trainer's flags for `epochs` epochs of 640 samples in <tmp>/w, then `extra`, after `argv`.
std::vector<std::string> with_flags(const TempDir& tmp, int epochs, std::vector<std::string> argv,
                                    const std::vector<std::string>& extra) {
  const std::vector<std::string> f = {"--data-dir", kDigits, "--epochs", std::to_string(epochs), "--limit", "640",
                                      "--test-limit", "128", "--threads", "1", "--log-interval", "1",
                                      "--checkpoint-interval", "3", "--batch-size", "64", "--work-dir", tmp.file("w")};
  argv.insert(argv.end(), f.begin(), f.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Two ranks under tandem-run, rank 0 SIGKILLed after global iteration 3 (right after checkpoint iter_3:
// 3 x 64 x 2 = 384 samples consumed); each rank's batches go to <tmp>/two.rank<r>. Returns the exit code.
int two_ranks_killed_after_iteration_3(const TempDir& tmp, int epochs) {
  return run_process(with_flags(tmp, epochs,
                                {kRun, "--standalone", "--nproc-per-node", "2", kTrainer, "--launcher", "pytorch",
                                 "--device", "cpu", "--dist-timeout", "60"},
                                {"--debug-sigkill-at", "3", "--debug-samples-out", tmp.file("two")}),
                     tmp / "two.log");
}

// Every index of the 640 samples once, sorted.
std::vector<int64_t> every_sample() {
  std::vector<int64_t> all(640);
  for (int64_t i = 0; i < 640; ++i) all[static_cast<size_t>(i)] = i;
  return all;
}

}  // namespace

TEST(ReshardResume, TwoRanksToOneVisitsExactlyTheRestOfTheEpoch) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("reshard");
  auto with = [&](std::vector<std::string> argv, const std::vector<std::string>& extra) {
    return with_flags(tmp, 2, std::move(argv), extra);
  };
  ASSERT_EQ(two_ranks_killed_after_iteration_3(tmp, 2), 137) << read_file(tmp / "two.log");

  ASSERT_EQ(run_process(with({kTrainer}, {"--resume"}), tmp / "refused.log"), 1) << read_file(tmp / "refused.log");
  EXPECT_HAS(read_file(tmp / "refused.log"), "was written by 2 rank(s) but this run has 1; resume with the same "
                                             "number of ranks, or let the rest of its epoch be re-sharded");

  ASSERT_EQ(run_process(with({kTrainer}, {"--resume", "--resume-reshard", "--debug-samples-out", tmp.file("one")}),
                        tmp / "one.log"),
            0)
      << read_file(tmp / "one.log");
  const std::string log = read_file(tmp / "one.log");
  EXPECT_HAS(log, "world size changed from 2 to 1: resuming epoch 1 after 384 of its 640 samples; the 256 left are "
                  "sharded over 1 rank(s), 4 iteration(s) each (global iteration 3)");

  const auto before = samples({tmp / "two.rank0", tmp / "two.rank1"}, 3);  // what the checkpoint holds
  const auto after = samples({tmp / "one.rank0"});
  ASSERT_EQ(before.count(1), 1u);
  ASSERT_EQ(after.count(1), 1u);
  EXPECT_EQ(before.at(1).size(), 384u);
  EXPECT_EQ(after.at(1).size(), 256u);
  std::vector<int64_t> epoch1 = before.at(1);
  epoch1.insert(epoch1.end(), after.at(1).begin(), after.at(1).end());
  std::sort(epoch1.begin(), epoch1.end());
  const std::vector<int64_t> all = every_sample();
  EXPECT_EQ(epoch1, all) << "epoch 1: a sample twice, or one lost";
  ASSERT_EQ(after.count(2), 1u);
  std::vector<int64_t> epoch2 = after.at(2);
  std::sort(epoch2.begin(), epoch2.end());
  EXPECT_EQ(epoch2, all) << "epoch 2 is a whole epoch";
}

// A checkpoint taken inside the re-sharded epoch (it saves where that sharding began) resumes on the
// same world size exactly where it stopped: the epoch still visits each sample once.
TEST(ReshardResume, ACheckpointInsideTheReshardedEpochResumesItExactly) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("reshard-twice");
  auto with = [&](std::vector<std::string> argv, const std::vector<std::string>& extra) {
    return with_flags(tmp, 1, std::move(argv), extra);
  };
  ASSERT_EQ(two_ranks_killed_after_iteration_3(tmp, 1), 137) << read_file(tmp / "two.log");
  // One process: the 256 left are 4 iterations (global 4..7); killed after global 6 (checkpoint iter_6).
  ASSERT_EQ(run_process(with({kTrainer}, {"--resume", "--resume-reshard", "--debug-sigkill-at", "6",
                                          "--debug-samples-out", tmp.file("one")}),
                        tmp / "one.log"),
            137)
      << read_file(tmp / "one.log");
  ASSERT_EQ(run_process(with({kTrainer}, {"--resume", "--debug-samples-out", tmp.file("again")}), tmp / "again.log"), 0)
      << read_file(tmp / "again.log");
  EXPECT_HAS(read_file(tmp / "again.log"), "resumed from " + tmp.file("w") + "/iter_6.safetensors: epoch 1, 3 of");
  std::vector<int64_t> epoch1 = samples({tmp / "two.rank0", tmp / "two.rank1"}, 3).at(1);
  const auto one = samples({tmp / "one.rank0"}, 3), again = samples({tmp / "again.rank0"});
  ASSERT_EQ(one.at(1).size(), 192u);
  ASSERT_EQ(again.at(1).size(), 64u);
  epoch1.insert(epoch1.end(), one.at(1).begin(), one.at(1).end());
  epoch1.insert(epoch1.end(), again.at(1).begin(), again.at(1).end());
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(epoch1, every_sample()) << "epoch 1 over three runs: a sample twice, or one lost";
}
