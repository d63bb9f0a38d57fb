// Faults injected into real 2-rank tandem-mnist jobs on loopback, under tandem-run or started by
// hand: a rank SIGKILLed or SIGSTOPped mid-epoch, tandem-run itself SIGTERMed, the store's
// server gone. Each test asserts the exit code AND the message, and bounds every wait (the
// bounds are the promises under test: e.g. "ends the others within 10 s"), never timing a result.
#include <gtest/gtest.h>

#include "fault/fault_util.h"
#include "common/require_data.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

// A 2-rank job that trains long enough to be interrupted (20 epochs of 8000 samples).
std::vector<std::string> job(const std::vector<std::string>& launcher_flags, double dist_timeout,
                             const fs::path& work_dir) {
  std::vector<std::string> argv = {kRun, "--standalone", "--nproc-per-node", "2"};
  argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
  for (const std::string& a :
       {kTrainer, std::string("--launcher"), std::string("pytorch"), std::string("--data-dir"), kDigits,
        std::string("--epochs"), std::string("20"), std::string("--test-limit"), std::string("256"),
        std::string("--log-interval"), std::string("5"), std::string("--dist-timeout")})
    argv.push_back(a);
  std::ostringstream t;
  t << dist_timeout;
  argv.push_back(t.str());
  argv.push_back("--work-dir");
  argv.push_back(work_dir.string());
  return argv;
}

constexpr const char* kTraining = "Epoch(train) [1][10/";

}  // namespace

TEST(LauncherFault, RankKilledMidEpochEndsTheOthersWithin10sNamingTheRank) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  Process run(job({}, 30, tmp / "work"), tmp / "log");
  ASSERT_TRUE(run.started());
  ASSERT_TRUE(run.wait_for_text(kTraining, seconds(120))) << run.output();
  const pid_t r0 = worker_pid(run.pid(), 0), r1 = worker_pid(run.pid(), 1);
  ASSERT_GT(r0, 0) << run.output();
  ASSERT_GT(r1, 0) << run.output();
  ASSERT_EQ(::kill(r1, SIGKILL), 0);
  // The dist timeout is 30 s: ending within 10 s means tandem-run ended rank 0, not a timeout.
  const auto rc = run.wait_for(seconds(10));
  ASSERT_TRUE(rc.has_value()) << "tandem-run still running 10 s after rank 1 was killed:\n" << run.output();
  EXPECT_EQ(*rc, 128 + SIGKILL);
  const std::string out = run.output();
  EXPECT_HAS(out, "tandem-run: rank 1 (local rank 1, pid " + std::to_string(r1) + ") was killed by SIGKILL");
  EXPECT_HAS(out, "ending the other 1 worker(s)");
  EXPECT_FALSE(process_exists(r0)) << "rank 0 survived its launcher";
}

TEST(LauncherFault, RankStoppedMakesTheCollectiveTimeoutNameTheOperationAndThePeer) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  Process run(job({"--grace-period", "1"}, 2, tmp / "work"), tmp / "log");
  ASSERT_TRUE(run.started());
  ASSERT_TRUE(run.wait_for_text(kTraining, seconds(120))) << run.output();
  const pid_t r1 = worker_pid(run.pid(), 1);
  ASSERT_GT(r1, 0) << run.output();
  ASSERT_EQ(::kill(r1, SIGSTOP), 0);
  // Bound: 2 s timeout + 0.5 s diagnosis + 1 s grace, with a wide margin for a loaded machine.
  const auto rc = run.wait_for(seconds(30));
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 1);
  const std::string out = run.output();
  // Rank 0's one error line names its group, the operation, Gloo's reason and the stopped peer. The
  // collective that times out is a bucket's all-reduce or, when rank 1 stopped after its step's, the stop
  // agreement after the step (then the message says so first).
  const std::string error = "[rank 0] tandem-mnist: error: ";
  const bool names_group =
      out.find(error + "ProcessGroupGloo rank 0 of 2: ") != std::string::npos ||
      out.find(error + "the stop agreement over the gloo group (rank 0 of 2) failed: ProcessGroupGloo rank 0 of 2: ") !=
          std::string::npos;
  EXPECT_TRUE(names_group) << out;
  const bool names_op = out.find(": allreduce(float32[") != std::string::npos ||
                        out.find(": allreduce(float64[1], max)") != std::string::npos ||
                        out.find(": broadcast(") != std::string::npos ||
                        out.find(": allgather(") != std::string::npos ||
                        out.find(": barrier()") != std::string::npos;
  EXPECT_TRUE(names_op) << out;
  EXPECT_HAS(out, "Timed out waiting 2000ms");
  EXPECT_HAS(out, "peer rank 1 never reached this collective");
  EXPECT_HAS(out, "tandem-run: rank 0 (local rank 0");
  EXPECT_HAS(out, "failed with exit code 1; ending the other 1 worker(s)");
  EXPECT_FALSE(process_exists(r1)) << "the stopped rank survived";
}

TEST(LauncherFault, SigtermToTandemRunIsForwardedToTheRanks) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  Process run(job({"--grace-period", "20"}, 30, tmp / "work"), tmp / "log");
  ASSERT_TRUE(run.started());
  ASSERT_TRUE(run.wait_for_text(kTraining, seconds(120))) << run.output();
  const pid_t r0 = worker_pid(run.pid(), 0), r1 = worker_pid(run.pid(), 1);
  ASSERT_GT(r0, 0);
  ASSERT_GT(r1, 0);
  ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
  const auto rc = run.wait_for(seconds(10));
  ASSERT_TRUE(rc.has_value()) << run.output();
  EXPECT_EQ(*rc, 128 + SIGTERM);
  const std::string out = run.output();
  EXPECT_HAS(out, "tandem-run: received SIGTERM; forwarding it to the workers");
  // The ranks ended on the forwarded SIGTERM, well inside the 20 s grace: no SIGKILL was needed.
  EXPECT_EQ(out.find("sending SIGKILL"), std::string::npos) << out;
  EXPECT_FALSE(process_exists(r0));
  EXPECT_FALSE(process_exists(r1));
}

// Without tandem-run (so nobody ends rank 1 for us): rank 0 hosts the store and dies mid-run;
// rank 1 must fail by itself within its timeout, naming rank 0.
// Rank 0 (the store host) SIGKILLed mid-run; `shm`: the ranks' all-reduce goes through shared memory
// (the default on one host) or Gloo's TCP pairs. The other rank's output is returned.
std::string kill_store_host_mid_run(bool shm) {
  TempDir tmp("fault");
  const int port = free_port();
  auto env = [&](int rank) {
    return std::vector<std::string>{"TANDEM_SHM=" + std::string(shm ? "1" : "0"),
                                    "RANK=" + std::to_string(rank),
                                    "WORLD_SIZE=2",
                                    "LOCAL_RANK=0",
                                    "LOCAL_WORLD_SIZE=1",
                                    "GROUP_RANK=" + std::to_string(rank),
                                    "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(port),
                                    "OMP_NUM_THREADS=1"};
  };
  std::vector<std::string> argv = {kTrainer,
                                   "--launcher",
                                   "pytorch",
                                   "--data-dir",
                                   kDigits,
                                   "--epochs",
                                   "20",
                                   "--test-limit",
                                   "256",
                                   "--log-interval",
                                   "5",
                                   "--dist-timeout",
                                   "3",
                                   "--work-dir",
                                   (tmp / "work").string()};
  Process r0(argv, tmp / "r0.log", env(0));
  Process r1(argv, tmp / "r1.log", env(1));
  if (!r0.wait_for_text(kTraining, seconds(120))) return "rank 0 never trained: " + r0.output() + r1.output();
  if (::kill(r0.pid(), SIGKILL) != 0) return "kill failed";
  const auto rc = r1.wait_for(seconds(20));
  if (!rc.has_value()) return "rank 1 still running 20 s after rank 0 was killed: " + r1.output();
  if (*rc != 1) return "rank 1 exited " + std::to_string(*rc) + ": " + r1.output();
  return r1.output();
}

TEST(StoreFault, StoreHostKilledMidRunTheOtherRankFailsNamingIt) {
  TANDEM_NEED_DATA(kDigits);
  // Shared memory: the waiting rank sees rank 0's process gone and names it at once.
  // The collective that fails is a bucket's all-reduce or the stop agreement after the step (then
  // the message says so first): either way the error names the group, this rank and the peer.
  const std::string via_shm = kill_store_host_mid_run(true);
  EXPECT_HAS(via_shm, "tandem-mnist: error: ");
  EXPECT_HAS(via_shm, "ProcessGroupGloo rank 1 of 2: ");
  EXPECT_HAS(via_shm, "rank 0 (pid ");
  EXPECT_HAS(via_shm, ") exited during the shared-memory all-reduce");
  const std::string out = kill_store_host_mid_run(false);
  EXPECT_HAS(out, "tandem-mnist: error: ");
  EXPECT_HAS(out, "ProcessGroupGloo rank 1 of 2: ");
  // The kernel closed rank 0's sockets (Gloo says "Connection closed by peer [addr]" or "Read
  // error [addr]: Connection reset by peer"): the peer's address is mapped to its rank (the
  // advertised address, or the peer's end of the connection it opened).
  const bool closed = out.find("Connection closed by peer [127.0.0.1]:") != std::string::npos ||
                      out.find("Connection reset by peer") != std::string::npos;
  EXPECT_TRUE(closed) << out;
  const bool names_rank0 = out.find("is rank 0)") != std::string::npos ||
                           out.find("is the connection to rank 0)") != std::string::npos;
  EXPECT_TRUE(names_rank0) << out;
}

// A rank whose store never comes up: it fails within its timeout naming the store's address.
TEST(StoreFault, NoStoreServerTheRankFailsWithinItsTimeoutNamingTheAddress) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  const int port = free_port();
  Process r1({kTrainer, "--launcher", "pytorch", "--data-dir", kDigits, "--limit", "64", "--dist-timeout", "2",
              "--work-dir", (tmp / "work").string()},
             tmp / "log",
             {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "GROUP_RANK=1",
              "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)});
  const auto rc = r1.wait_for(seconds(20));
  ASSERT_TRUE(rc.has_value()) << r1.output();
  EXPECT_EQ(*rc, 1);
  const std::string out = r1.output();
  EXPECT_HAS(out, "127.0.0.1:" + std::to_string(port));
  EXPECT_HAS(out, "tandem-mnist: error: ");
  EXPECT_EQ(lines_in(out), 1u) << out;
}
