// A real one-node Slurm cluster on loopback (scripts/ci/slurm/start.sh: munged with a generated
// key, slurmctld, slurmd, all state under a temporary directory), and a 2-task srun of
// tandem-mnist --launcher slurm trained to a set test accuracy. The ranks find each other only
// through Slurm's variables: MASTER_ADDR is left unset, so it is derived from
// SLURM_STEP_NODELIST. Then a task is SIGKILLed mid-run: srun (--kill-on-bad-exit) ends the
// other and fails naming the task. The daemons are stopped (stop.sh) whatever happens, and the test checks
// that they are gone. Skips with the reason when not root or the daemons cannot start.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fault/fault_util.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

const std::string kSlurmDir = kSource + "/scripts/ci/slurm";

// The test accuracy of the last "eval" line of a metrics file (-1 when none).
double last_accuracy(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::string line;
  double acc = -1;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == "eval") acc = j.value("test_accuracy", -1.0);
  }
  return acc;
}

std::vector<pid_t> daemon_pids(const fs::path& dir) {
  std::vector<pid_t> out;
  for (const fs::path& f : {dir / "slurmd.pid", dir / "slurmctld.pid", dir / "munge" / "munged.pid"}) {
    std::ifstream in(f);
    pid_t p = 0;
    if (in >> p && p > 0) out.push_back(p);
  }
  return out;
}

// srun of 2 tandem-mnist tasks (--launcher slurm) with `flags`; --time bounds the job inside Slurm
// too (minutes), and --kill-on-bad-exit ends the other task when one fails.
std::vector<std::string> srun_trainer(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {"/usr/bin/srun", "-n", "2", "--cpus-per-task", "1", "--time", "3",
                                   "--kill-on-bad-exit=1", kTrainer, "--launcher", "slurm", "--data-dir", kDigits};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

// Starts the cluster in `dir`; stops it on destruction.
class SlurmCluster {
 public:
  explicit SlurmCluster(const fs::path& dir) : dir_(dir) {
    Process start({"/bin/bash", kSlurmDir + "/start.sh", dir.string()}, dir.parent_path() / "start.log");
    const auto rc = start.wait_for(seconds(90));
    rc_ = rc ? *rc : -1;
    output_ = start.output();
  }
  ~SlurmCluster() { stop(); }
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    Process stop({"/bin/bash", kSlurmDir + "/stop.sh", dir_.string()}, dir_.parent_path() / "stop.log");
    stop.wait_for(seconds(30));
  }
  int rc() const { return rc_; }
  const std::string& output() const { return output_; }
  std::string conf() const { return (dir_ / "slurm.conf").string(); }

 private:
  fs::path dir_;
  int rc_ = -1;
  std::string output_;
  bool stopped_ = false;
};

}  // namespace

TEST(SlurmCluster, SrunTwoTasksTrainsMnistToNinetyPercent) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to run slurmd and munged";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("slurm");
  const fs::path dir = tmp / "cluster";
  std::vector<pid_t> daemons;
  {
    SlurmCluster cluster(dir);
    daemons = daemon_pids(dir);
    if (cluster.rc() == 77) GTEST_SKIP() << "Slurm cannot run here: " << cluster.output();
    ASSERT_EQ(cluster.rc(), 0) << cluster.output();
    ASSERT_EQ(daemons.size(), 3u) << cluster.output();

    // A job's environment: the cluster's config, MASTER_ADDR left unset, a free MASTER_PORT.
    auto env = [&](const std::vector<std::string>& extra) {
      std::vector<std::string> e = {"SLURM_CONF=" + cluster.conf(), "MASTER_ADDR",
                                    "MASTER_PORT=" + std::to_string(free_port()), "OMP_NUM_THREADS=1"};
      e.insert(e.end(), extra.begin(), extra.end());
      return e;
    };
    Process sinfo({"/usr/bin/sinfo", "-h", "-N", "-o", "%N %T %c"}, tmp / "sinfo.log",
                  {"SLURM_CONF=" + cluster.conf()});
    ASSERT_EQ(sinfo.wait_for(seconds(30)), 0) << sinfo.output();
    EXPECT_HAS(sinfo.output(), "idle");

    // The wait below bounds the job here.
    Process job(srun_trainer({"--epochs", "1", "--test-limit", "1000", "--dist-timeout", "60", "--log-interval",
                              "20", "--work-dir", (tmp / "work").string(), "--metrics-out",
                              (tmp / "m.jsonl").string()}),
                tmp / "job.log", env({}));
    ASSERT_TRUE(job.started());
    const auto rc = job.wait_for(seconds(150));
    ASSERT_TRUE(rc.has_value()) << "srun still running after 150 s:\n" << job.output();
    EXPECT_EQ(*rc, 0) << job.output();
    const std::string out = job.output();
    EXPECT_HAS(out, "distributed: 2 ranks over gloo (launcher slurm)");
    EXPECT_HAS(out, "batch 64 per rank x 2 ranks");
    EXPECT_GE(last_accuracy(tmp / "m.jsonl"), 0.90) << out;

    // A task SIGKILLed mid-run: with --kill-on-bad-exit Slurm ends the other task and srun fails,
    // saying which task died.
    const std::string marker = "TANDEM_SLURM_MARK=" + std::to_string(::getpid());
    Process doomed(srun_trainer({"--epochs", "20", "--test-limit", "100", "--dist-timeout", "60", "--log-interval",
                                 "5", "--work-dir", (tmp / "work2").string()}),
                   tmp / "doomed.log", env({marker}));
    ASSERT_TRUE(doomed.wait_for_text("Epoch(train) [1][10/", seconds(120))) << doomed.output();
    pid_t task1 = -1;
    for (pid_t pid : all_pids()) {
      const fs::path exe = "/proc/" + std::to_string(pid) + "/exe";
      std::error_code ec;
      if (carries_env(pid, marker) && carries_env(pid, "SLURM_PROCID=1") &&
          fs::read_symlink(exe, ec).filename() == "tandem-mnist")
        task1 = pid;
    }
    ASSERT_GT(task1, 0) << "task 1 not found";
    ASSERT_EQ(::kill(task1, SIGKILL), 0);
    const auto rc2 = doomed.wait_for(seconds(60));
    ASSERT_TRUE(rc2.has_value()) << "srun still running 60 s after task 1 was killed:\n" << doomed.output();
    EXPECT_NE(*rc2, 0);
    EXPECT_HAS(doomed.output(), "task 1: Killed");
  }
  // The cluster's destructor ran stop.sh: no daemon may be left on the machine.
  for (pid_t p : daemons) EXPECT_FALSE(process_exists(p)) << "daemon pid " << p << " still running";
}
