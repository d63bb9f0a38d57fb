// tools/dist_train.sh and tools/slurm_train.sh as MMRazor users type them, with real processes:
//   - `CUDA_VISIBLE_DEVICES=-1 sh tools/dist_train.sh CONFIG 2` twice at once with PORT=p1/PORT=p2:
//     both train (2 CPU processes each) and each rank 0's store listens on its PORT; checkpoints and
//     logs land in work_dirs/<config name>/;
//   - `--cfg-options dist_params.port=Q` while PORT's port is held by another listener: the job
//     uses Q (else tandem-run or the store would find PORT taken), and under plain tandem-run the
//     trainer's store moves to Q away from MASTER_PORT;
//   - `GPUS=2 GPUS_PER_NODE=2 sh tools/slurm_train.sh PARTITION JOB CONFIG WORK_DIR` on the real
//     one-node Slurm cluster (scripts/ci/slurm; skipped with the reason where it cannot start).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

const std::string kTools = TANDEM_SOURCE_DIR "/tools";
const std::string kBaseConfig = TANDEM_SOURCE_DIR "/configs/mnist_adadelta_cosine_1ep.json";

// A config named `name`.json in dir, inheriting the bundled one-epoch recipe.
std::string write_config(const fs::path& dir, const std::string& name) {
  const fs::path p = dir / (name + ".json");
  std::ofstream(p) << R"({"_base_": ")" << kBaseConfig << R"("})";
  return p.string();
}

// Small-run flags for tandem-mnist after the config.
std::vector<std::string> small_run() {
  return {"--data-dir", kDigits, "--limit", "512", "--test-limit", "200", "--log-interval", "2", "--dist-timeout", "60"};
}

std::vector<std::string> env_of(const std::vector<std::string>& extra) {
  std::vector<std::string> e = {"CUDA_VISIBLE_DEVICES=-1", "TANDEM_BIN=" TANDEM_BINARY_DIR "/apps", "OMP_NUM_THREADS=1",
                                "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
  e.insert(e.end(), extra.begin(), extra.end());
  return e;
}

// A listening socket on 127.0.0.1:port for the life of the object.
class Listener {
 public:
  explicit Listener(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd_, 4) == 0;
  }
  ~Listener() { ::close(fd_); }
  bool ok() const { return ok_; }

 private:
  int fd_;
  bool ok_ = false;
};

}  // namespace

TEST(DistTrainSh, TwoJobsAtOnceOnDifferentPorts) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("tools");
  const std::string a = write_config(tmp.path(), "job_a"), b = write_config(tmp.path(), "job_b");
  const int pa = free_port();
  int pb = free_port();
  while (pb == pa) pb = free_port();
  auto job = [&](const std::string& cfg, int port, const std::string& log) {
    std::vector<std::string> argv = {"/bin/sh", kTools + "/dist_train.sh", cfg, "2"};
    for (const std::string& f : small_run()) argv.push_back(f);
    return Process(Spawn{.argv = argv, .env = env_of({"PORT=" + std::to_string(port)}), .out = tmp / log,
                         .cwd = tmp.path(), .own_group = true});
  };
  Process ja = job(a, pa, "a.log"), jb = job(b, pb, "b.log");
  const auto ra = ja.wait_for(seconds(300)), rb = jb.wait_for(seconds(300));
  ASSERT_TRUE(ra && rb) << ja.output() << jb.output();
  EXPECT_EQ(*ra, 0) << ja.output();
  EXPECT_EQ(*rb, 0) << jb.output();
  EXPECT_HAS(ja.output(), "distributed: 2 ranks over gloo (launcher pytorch), store 127.0.0.1:" + std::to_string(pa));
  EXPECT_HAS(jb.output(), "distributed: 2 ranks over gloo (launcher pytorch), store 127.0.0.1:" + std::to_string(pb));
  for (const char* name : {"job_a", "job_b"}) {
    const fs::path wd = tmp / "work_dirs" / name;
    EXPECT_TRUE(fs::exists(wd / "last_checkpoint")) << wd;
    EXPECT_TRUE(fs::exists(wd / "config.json")) << wd;
  }
}

TEST(DistTrainSh, DistParamsPortIsThePortUsed) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("tools");
  const std::string cfg = write_config(tmp.path(), "job_port");
  const int held = free_port();
  int wanted = free_port();
  while (wanted == held) wanted = free_port();
  Listener listener(held);  // PORT's port is taken: only dist_params.port can make the job run
  ASSERT_TRUE(listener.ok());
  std::vector<std::string> argv = {"/bin/sh", kTools + "/dist_train.sh", cfg, "2"};
  for (const std::string& f : small_run()) argv.push_back(f);
  argv.insert(argv.end(), {"--cfg-options", "dist_params.port=" + std::to_string(wanted)});
  Process job(Spawn{.argv = argv, .env = env_of({"PORT=" + std::to_string(held)}), .out = tmp / "job.log",
                    .cwd = tmp.path(), .own_group = true});
  const auto rc = job.wait_for(seconds(300));
  ASSERT_TRUE(rc.has_value()) << job.output();
  EXPECT_EQ(*rc, 0) << job.output();
  EXPECT_HAS(job.output(), "store 127.0.0.1:" + std::to_string(wanted));

  // Under plain tandem-run (MASTER_PORT = --master-port), the trainer's store moves to dist_params.port.
  const int master = free_port();
  std::vector<std::string> direct = {kRun, "--nproc-per-node", "2", "--master-port", std::to_string(master), kTrainer,
                                     cfg, "--launcher", "pytorch", "--work-dir", tmp.file("direct")};
  for (const std::string& f : small_run()) direct.push_back(f);
  direct.insert(direct.end(), {"--cfg-options", "dist_params.port=" + std::to_string(wanted)});
  Process d(direct, tmp / "direct.log", env_of({}));
  const auto rd = d.wait_for(seconds(300));
  ASSERT_TRUE(rd.has_value()) << d.output();
  EXPECT_EQ(*rd, 0) << d.output();
  EXPECT_HAS(d.output(), "store 127.0.0.1:" + std::to_string(wanted));
  EXPECT_EQ(d.output().find("store 127.0.0.1:" + std::to_string(master)), std::string::npos) << d.output();
}

TEST(SlurmTrainSh, TwoTasksOnTheOneNodeCluster) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to run slurmd and munged";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("tools");
  const fs::path dir = tmp / "cluster";
  const std::string slurm = TANDEM_SOURCE_DIR "/scripts/ci/slurm";
  Process start({"/bin/bash", slurm + "/start.sh", dir.string()}, tmp / "start.log");
  const auto started = start.wait_for(seconds(90));
  struct Stop {
    std::string slurm;
    fs::path dir, log;
    ~Stop() { Process({"/bin/bash", slurm + "/stop.sh", dir.string()}, log).wait_for(seconds(30)); }
  } stop{slurm, dir, tmp / "stop.log"};
  if (started && *started == 77) GTEST_SKIP() << "Slurm cannot run here: " << start.output();
  ASSERT_EQ(started.value_or(-1), 0) << start.output();

  const std::string cfg = write_config(tmp.path(), "job_slurm");
  std::vector<std::string> argv = {"/bin/sh", kTools + "/slurm_train.sh", "tandem", "tandem_tools_test", cfg,
                                   tmp.file("work")};
  for (const std::string& f : small_run()) argv.push_back(f);
  Process job(Spawn{.argv = argv,
                    .env = env_of({"SLURM_CONF=" + (dir / "slurm.conf").string(), "GPUS=2", "GPUS_PER_NODE=2",
                                   "CPUS_PER_TASK=1", "SRUN_ARGS=--time=3",
                                   "PORT=" + std::to_string(free_port())}),
                    .out = tmp / "job.log", .cwd = tmp.path(), .own_group = true});
  const auto rc = job.wait_for(seconds(240));
  ASSERT_TRUE(rc.has_value()) << job.output();
  EXPECT_EQ(*rc, 0) << job.output();
  EXPECT_HAS(job.output(), "distributed: 2 ranks over gloo (launcher slurm)");
  EXPECT_TRUE(fs::exists(tmp / "work" / "last_checkpoint")) << job.output();
}
