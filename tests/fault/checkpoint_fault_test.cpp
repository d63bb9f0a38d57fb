// Faults around training state, on real tandem-mnist runs: a loss that turns NaN (one process,
// and 2 ranks under tandem-run) stops cleanly naming the iteration; the work dir filling up or
// turning unwritable while a checkpoint is written gives one clear error and leaves the previous
// checkpoint intact and resumable; SIGTERM to tandem-run leaves a checkpoint that --resume
// continues from. Exit codes and messages are asserted; every wait is bounded.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fault/fault_util.h"
#include "nn/models/mnist_net.h"
#include "nn/module.h"
#include "common/require_data.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

// A filesystem mounted at `dir` for the test's lifetime; unmounted on destruction.
class Mount {
 public:
  Mount(const fs::path& dir, const std::string& options, const fs::path& log_dir) : dir_(dir), log_(log_dir) {
    fs::create_directories(dir);
    ok_ = ::getuid() == 0 && run_shell("mount " + options + " " + dir.string(), log_ / "mount.log") == 0;
  }
  ~Mount() {
    if (ok_) run_shell("umount " + dir_.string() + " || umount -l " + dir_.string(), log_ / "umount.log");
  }
  bool ok() const { return ok_; }

 private:
  fs::path dir_, log_;
  bool ok_ = false;
};

std::vector<std::string> trainer(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {kTrainer, "--data-dir", kDigits, "--test-limit", "64", "--threads", "1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

// Sets the fc2 bias of a checkpoint's weights to NaN, so that a run resumed from it has a NaN loss
// at its first iteration. False if the checkpoint is not there.
bool poison_fc2_bias(const fs::path& weights) {
  if (!fs::exists(weights)) return false;
  tandem::nn::models::MnistNet net;
  tandem::nn::load_weights(net, weights.string());
  net.fc2->bias.fill_(std::nan(""));
  tandem::nn::save_weights(net, weights.string());
  return true;
}

}  // namespace

TEST(NanLoss, OneProcessStopsNamingTheIteration) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  // The first iteration trains from good weights and is checkpointed; from the second on, the run
  // starts from weights whose fc2 bias is NaN (resumed from a checkpoint poisoned in between), so
  // its first loss is NaN: a real NaN through the whole forward, at a known iteration.
  Process first(trainer({"--limit", "640", "--log-interval", "1", "--checkpoint-interval", "1", "--epochs", "1",
                         "--debug-sigterm-at", "1", "--work-dir", (tmp / "w").string()}),
                tmp / "log1");
  const auto rc1 = first.wait_for(seconds(60));
  ASSERT_TRUE(rc1.has_value()) << first.output();
  ASSERT_EQ(*rc1, 143) << first.output();
  ASSERT_TRUE(poison_fc2_bias(tmp / "w" / "iter_1.safetensors")) << first.output();
  Process run(trainer({"--limit", "640", "--log-interval", "1", "--checkpoint-interval", "1", "--epochs", "1",
                       "--resume", "--work-dir", (tmp / "w").string()}),
              tmp / "log");
  const auto rc = run.wait_for(seconds(60));
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 1);
  const std::string out = run.output();
  EXPECT_HAS(out, "tandem-mnist: error: the loss is nan at epoch 1, iteration 2/10 (global iteration 2)");
  EXPECT_HAS(out, "lower optim_wrapper.optimizer.lr (--lr)");
  // Nothing after the NaN was saved: the last checkpoint is the one of iteration 1.
  EXPECT_EQ(out.find("iter_2.safetensors"), std::string::npos) << out;
  EXPECT_HAS(read_file(tmp / "w" / "last_checkpoint"), "iter_1.safetensors");
}

TEST(NanLoss, TwoRanksUnderTandemRunStopNamingTheIteration) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  // As above: one checkpointed iteration, then a resume from weights with a NaN fc2 bias.
  auto job = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> flags = {"--launcher", "pytorch", "--limit", "1280", "--epochs", "1",
                                      "--checkpoint-interval", "1", "--dist-timeout", "10",
                                      "--work-dir", (tmp / "w").string()};
    flags.insert(flags.end(), extra.begin(), extra.end());
    std::vector<std::string> argv = {kRun, "--standalone", "--nproc-per-node", "2"};
    for (const auto& a : trainer(flags)) argv.push_back(a);
    return argv;
  };
  Process first(job({"--debug-sigterm-at", "1"}), tmp / "log1");
  const auto rc1 = first.wait_for(seconds(60));
  ASSERT_TRUE(rc1.has_value()) << first.output();
  ASSERT_NE(*rc1, 0) << first.output();
  ASSERT_TRUE(poison_fc2_bias(tmp / "w" / "iter_1.safetensors")) << first.output();
  Process run(job({"--resume"}), tmp / "log");
  const auto rc = run.wait_for(seconds(60));
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 1);
  const std::string out = run.output();
  // Gradients are averaged, so both ranks diverge at the same iteration; the first one reaped is
  // reported by tandem-run and the other is ended.
  EXPECT_HAS(out, "tandem-mnist: error: the loss is nan at epoch 1, iteration 2/10 (global iteration 2)");
  EXPECT_HAS(out, "failed with exit code 1");
}

// The work dir is a 4 MiB tmpfs: the first checkpoint (~2.6 MiB) fits, the second does not.
TEST(CheckpointFault, DiskFullWhileCheckpointingKeepsThePreviousCheckpointResumable) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  Mount small(tmp / "small", "-t tmpfs -o size=4m tmpfs", tmp.path());
  if (!small.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const fs::path w = tmp / "small" / "w";
  Process run(trainer({"--limit", "1280", "--checkpoint-interval", "5", "--log-interval", "5", "--work-dir",
                       w.string()}),
              tmp / "log");
  const auto rc = run.wait_for(seconds(60));
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 1);
  const std::string out = run.output();
  EXPECT_HAS(out, "checkpoint saved: " + (w / "iter_5.safetensors").string());
  EXPECT_HAS(out, "tandem-mnist: error: ");
  EXPECT_HAS(out, "iter_10");
  EXPECT_HAS(out, "No space left on device");
  // The failed save left no partial files, and last_checkpoint still names iteration 5.
  EXPECT_FALSE(fs::exists(w / "iter_10.safetensors"));
  EXPECT_FALSE(fs::exists(w / "iter_10.state.safetensors"));
  for (const auto& e : fs::directory_iterator(w))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
  EXPECT_HAS(read_file(w / "last_checkpoint"), "iter_5.safetensors");
  // Intact: a run resumes from it (copied to a roomy disk) and finishes the epoch.
  const fs::path copy = tmp / "copy";
  fs::create_directories(copy);
  for (const char* f : {"iter_5.safetensors", "iter_5.state.safetensors"}) fs::copy_file(w / f, copy / f);
  Process resume(trainer({"--limit", "1280", "--log-interval", "5", "--work-dir", (tmp / "w2").string(),
                          "--resume", (copy / "iter_5.safetensors").string()}),
                 tmp / "resume.log");
  const auto rc2 = resume.wait_for(seconds(60));
  ASSERT_TRUE(rc2.has_value()) << resume.output();
  EXPECT_EQ(*rc2, 0) << resume.output();
  EXPECT_HAS(resume.output(), "resumed from");
  EXPECT_HAS(resume.output(), "5 of 20 iterations done");
  EXPECT_HAS(resume.output(), "Epoch(test) [1]");
}

// The work dir turns unwritable mid-run: made immutable (chattr +i, which binds root too) after
// the first checkpoint, so no file can be created or renamed in it. (A read-only remount is
// refused while the trainer holds its log open for writing.)
TEST(CheckpointFault, WorkDirTurnedUnwritableGivesAClearErrorAndKeepsThePreviousCheckpoint) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  const fs::path w = tmp / "w";
  Process run(trainer({"--limit", "8000", "--epochs", "3", "--checkpoint-interval", "20", "--log-interval", "5",
                       "--work-dir", w.string()}),
              tmp / "log");
  ASSERT_TRUE(run.wait_for_text("checkpoint saved: " + (w / "iter_20.safetensors").string(), seconds(60)))
      << run.output();
  ::kill(run.pid(), SIGSTOP);  // hold it still while the directory changes
  const std::string weights_before = read_file(w / "iter_20.safetensors");
  const bool immutable = run_shell("chattr +i " + w.string(), tmp / "chattr.log") == 0;
  ::kill(run.pid(), SIGCONT);
  if (!immutable) {
    run.wait_for(seconds(90));
    GTEST_SKIP() << "chattr +i is not supported here: " << read_file(tmp / "chattr.log");
  }
  const auto rc = run.wait_for(seconds(90));
  run_shell("chattr -i " + w.string(), tmp / "chattr2.log");  // before any assertion can return
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 1);
  const std::string out = run.output();
  EXPECT_HAS(out, "tandem-mnist: error: ");
  EXPECT_HAS(out, "Operation not permitted");
  EXPECT_HAS(out, w.string());
  EXPECT_HAS(read_file(w / "last_checkpoint"), "iter_20.safetensors");
  EXPECT_EQ(read_file(w / "iter_20.safetensors"), weights_before);
}

TEST(CheckpointFault, SigtermToTandemRunLeavesACheckpointThatResumes) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  const fs::path w = tmp / "w";
  auto job = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {kRun, "--standalone", "--nproc-per-node", "2", "--grace-period", "30"};
    std::vector<std::string> flags = {"--launcher",     "pytorch", "--epochs",       "2",
                                      "--log-interval", "5",       "--dist-timeout", "30",
                                      "--work-dir",     w.string()};
    flags.insert(flags.end(), extra.begin(), extra.end());
    for (const auto& a : trainer(flags)) argv.push_back(a);
    return argv;
  };
  {
    Process run(job({}), tmp / "log");
    ASSERT_TRUE(run.wait_for_text("Epoch(train) [1][10/", seconds(120))) << run.output();
    ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
    const auto rc = run.wait_for(seconds(30));
    ASSERT_TRUE(rc.has_value()) << run.output();
    EXPECT_EQ(*rc, 128 + SIGTERM);
    const std::string out = run.output();
    EXPECT_HAS(out, "tandem-run: received SIGTERM; forwarding it to the workers");
    EXPECT_HAS(out, "checkpoint saved: ");
    EXPECT_HAS(out, "stopped by signal 15 (SIGTERM); resume with --resume");
    EXPECT_EQ(out.find("sending SIGKILL"), std::string::npos) << out;
    ASSERT_TRUE(fs::exists(w / "last_checkpoint"));
  }
  Process again(job({"--resume"}), tmp / "log2");
  const auto rc = again.wait_for(seconds(180));
  ASSERT_TRUE(rc.has_value()) << again.output();
  EXPECT_EQ(*rc, 0) << again.output();
  EXPECT_HAS(again.output(), "resumed from");
  EXPECT_HAS(again.output(), "Epoch(test) [2]");
}
