// Multi-node restarts through tandem-run's agent rendezvous, on two network namespaces joined by a
// veth pair (two_hosts.h): one tandem-run per "host", one worker each, the rendezvous store served
// by the agent on 10.77.0.1. Both hosts see one file system, so they share the work dir (as nodes
// on a shared file system would). Every run is bounded; nothing is timed.
#include <gtest/gtest.h>

#include <thread>

#include "cluster/two_hosts.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

// One node's tandem-run (--nnodes `nnodes`, no --node-rank: the store's host is node 0) and its worker.
std::vector<std::string> agent(const std::string& nnodes, int port, const std::vector<std::string>& launcher,
                               const fs::path& work, const std::vector<std::string>& train) {
  std::vector<std::string> argv = {kRun, "--nnodes", nnodes, "--master-addr", TwoHosts::kAddrA, "--master-port",
                                   std::to_string(port), "--nproc-per-node", "1", "--grace-period", "2",
                                   "--rdzv-conf", "last_call_timeout=1,join_timeout=60,timeout=20"};
  argv.insert(argv.end(), launcher.begin(), launcher.end());
  argv.insert(argv.end(), {kTrainer, "--launcher", "pytorch", "--data-dir", kDigits, "--limit", "640", "--test-limit",
                           "128", "--threads", "1", "--log-interval", "1", "--checkpoint-interval", "3",
                           "--dist-timeout", "20", "--work-dir", work.string()});
  argv.insert(argv.end(), train.begin(), train.end());
  return argv;
}


}  // namespace

// --nnodes 2 --max-restarts 1: the rank on node b is SIGKILLed after global iteration 4 (checkpoint
// iter_3 the latest). Both agents restart together (round 1 in both logs), the group resumes from
// the checkpoint, and the final weights are bitwise those of an uninterrupted 2-node run.
TEST(ElasticTwoHosts, RankKilledOnOneNodeRestartsBothNodesAndEndsBitwiseLikeAnUninterruptedRun) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("elastic-restart");
  TwoHosts hosts(tmp.path());
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error();
  const int port = 29600 + ::getpid() % 300 + 3;
  auto job = [&](const std::string& name, const std::vector<std::string>& extra, int p) {
    std::vector<std::string> train = {"--epochs", "2", "--save-weights", tmp.file(name + ".safetensors")};
    train.insert(train.end(), extra.begin(), extra.end());
    Process a(hosts.in(hosts.a(), agent("2", p, {"--max-restarts", "1"}, tmp / name, train)), tmp / (name + "_a.log"),
              {"OMP_NUM_THREADS=1"});
    Process b(hosts.in(hosts.b(), agent("2", p, {"--max-restarts", "1"}, tmp / name, train)), tmp / (name + "_b.log"),
              {"OMP_NUM_THREADS=1"});
    const auto ra = a.wait_for(seconds(180)), rb = b.wait_for(seconds(60));
    EXPECT_TRUE(ra && rb) << a.output() << "\n---\n" << b.output();
    EXPECT_EQ(ra.value_or(-1), 0) << a.output();
    EXPECT_EQ(rb.value_or(-1), 0) << b.output();
    return std::make_pair(a.output(), b.output());
  };
  const auto full = job("full", {}, port);
  EXPECT_HAS(full.first, "rendezvous round 0 at tcp://10.77.0.1:" + std::to_string(port) +
                             ": node rank 0 of 2 node(s), world size 2");
  EXPECT_HAS(full.second, ": node rank 1 of 2 node(s), world size 2");
  const auto cut = job("cut", {"--debug-sigkill-at", "4", "--debug-sigkill-rank", "1"}, port + 1);
  const std::string& a = cut.first;
  const std::string& b = cut.second;
  EXPECT_HAS(b, "tandem-run: rank 1 (local rank 0");
  EXPECT_HAS(b, "was killed by SIGKILL (exit code 137)");
  // Node a's rank fails on the broken connection (or is ended by its agent first); either way the
  // restart names the rank that was killed.
  for (const std::string* log : {&a, &b}) {
    EXPECT_HAS(*log, "restarting the worker group with the other nodes (restart 1 of 1) after node 1 (host ");
    EXPECT_HAS(*log, "rank 1 was killed by SIGKILL (exit code 137)");
    EXPECT_HAS(*log, "rendezvous round 1 at tcp://10.77.0.1:");
  }
  EXPECT_HAS(a, "restart 1 of the worker group: resuming from the last checkpoint");
  EXPECT_HAS(a, "iter_3.safetensors");
  expect_same_weights(tmp / "full.safetensors", tmp / "cut.safetensors");
}

// --nnodes 1:2: node b's agent and worker are SIGKILLed together mid-run (every process of its
// namespace). Node a's worker fails on the broken connection; its agent's next round closes with
// node a alone (>= MIN), and the job goes on at world size 1 from the last checkpoint, re-sharded.
TEST(ElasticTwoHosts, LosingANodeOfOneToTwoGoesOnAloneFromTheLastCheckpoint) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("elastic-lose");
  TwoHosts hosts(tmp.path());
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error();
  const int port = 29600 + ::getpid() % 300 + 5;
  const std::vector<std::string> train = {"--epochs", "12"};
  Process a(hosts.in(hosts.a(), agent("1:2", port, {"--max-restarts", "2"}, tmp / "w", train)), tmp / "a.log",
            {"OMP_NUM_THREADS=1"});
  Process b(hosts.in(hosts.b(), agent("1:2", port, {"--max-restarts", "2"}, tmp / "w", train)), tmp / "b.log",
            {"OMP_NUM_THREADS=1"});
  // Both in round 0, and a checkpoint of epoch 2 on disk: then node b goes.
  ASSERT_TRUE(a.wait_for_text("node rank 0 of 2 node(s), world size 2", seconds(60))) << a.output() << b.output();
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][3/5]", seconds(120))) << a.output() << b.output();
  ASSERT_TRUE(hosts.kill_all(hosts.b()));
  const auto ra = a.wait_for(seconds(240));
  ASSERT_TRUE(ra.has_value()) << "node a still running:\n" << a.output();
  const std::string out = a.output();
  EXPECT_EQ(*ra, 0) << out;
  EXPECT_HAS(out, "rendezvous round 1 at tcp://10.77.0.1:" + std::to_string(port) +
                      ": node rank 0 of 1 node(s), world size 1");
  EXPECT_HAS(out, "world size changed from 2 to 1: resuming epoch ");
  EXPECT_HAS(out, "Epoch(test) [12]");
  EXPECT_TRUE(b.wait_for(seconds(10)).has_value()) << b.output();
}

// --nnodes 2 --max-restarts 1: the rank on node b is SIGSTOPped mid-run (alive, connected, silent).
// Node a's rank fails at its collective timeout (3 s); node b's agent sees the failure recorded, ends
// its stopped worker (SIGKILL after the grace: SIGTERM waits while it is stopped), and both nodes
// go on together in round 1 to the end.
TEST(ElasticTwoHosts, ARankStoppedOnOneNodeEndsAtTheCollectiveTimeoutAndBothNodesRestart) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("elastic-stop");
  TwoHosts hosts(tmp.path());
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error();
  const int port = 29600 + ::getpid() % 300 + 7;
  const std::vector<std::string> train = {"--epochs", "20", "--dist-timeout", "3"};
  Process a(hosts.in(hosts.a(), agent("2", port, {"--max-restarts", "1"}, tmp / "w", train)), tmp / "a.log",
            {"OMP_NUM_THREADS=1"});
  Process b(hosts.in(hosts.b(), agent("2", port, {"--max-restarts", "1"}, tmp / "w", train)), tmp / "b.log",
            {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][1/5]", seconds(120))) << a.output() << b.output();
  const pid_t rank1 = worker_pid(b.pid(), 1);
  ASSERT_GT(rank1, 0) << "no worker with RANK=1 under node b's tandem-run";
  ASSERT_EQ(::kill(rank1, SIGSTOP), 0);
  const auto ra = a.wait_for(seconds(240)), rb = b.wait_for(seconds(60));
  ASSERT_TRUE(ra && rb) << a.output() << "\n---\n" << b.output();
  EXPECT_EQ(*ra, 0) << a.output();
  EXPECT_EQ(*rb, 0) << b.output();
  EXPECT_HAS(a.output(), "Timed out waiting 3000ms");
  EXPECT_HAS(b.output(), "round 0 failed on another node: node 0 (host ");
  EXPECT_HAS(b.output(), "workers still running 2 s after the request to stop; sending SIGKILL");
  for (const std::string& log : {a.output(), b.output()})
    EXPECT_HAS(log, "rendezvous round 1 at tcp://10.77.0.1:" + std::to_string(port));
  EXPECT_HAS(a.output(), "Epoch(test) [20]");
}

// The agent that serves the rendezvous store (node a's tandem-run) SIGKILLed mid-run: its workers die
// with it (parent-death signal); node b's rank fails on the broken connection, and node b's agent,
// unable to reach the store to record it, exits 1 naming the store's address within the bound.
TEST(ElasticTwoHosts, TheStoreHostsAgentKilledEndsTheOtherAgentNamingTheStore) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("elastic-store");
  TwoHosts hosts(tmp.path());
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error();
  const int port = 29600 + ::getpid() % 300 + 9;
  const std::vector<std::string> train = {"--epochs", "20", "--dist-timeout", "5"};
  Process a(hosts.in(hosts.a(), agent("2", port, {"--max-restarts", "1"}, tmp / "w", train)), tmp / "a.log",
            {"OMP_NUM_THREADS=1"});
  Process b(hosts.in(hosts.b(), agent("2", port, {"--max-restarts", "1"}, tmp / "w", train)), tmp / "b.log",
            {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][1/5]", seconds(120))) << a.output() << b.output();
  ASSERT_EQ(::kill(a.pid(), SIGKILL), 0);
  // Bound: the broken connection (at once) or the 5 s collective timeout, then the agent's store
  // calls (timeout=20 in agent(): a connect that cannot succeed), with margin.
  const auto rb = b.wait_for(seconds(90));
  ASSERT_TRUE(rb.has_value()) << "node b still running:\n" << b.output();
  EXPECT_EQ(*rb, 1) << b.output();
  EXPECT_HAS(b.output(), "tandem-run: error: cannot reach the rendezvous store at tcp://10.77.0.1:" +
                             std::to_string(port));
}

// --nnodes 2 --max-restarts 2: the link goes down mid-run for 4 s and comes back. The ranks fail at
// their collective timeout (3 s); the agents' store calls wait out the cut (timeout=20), agree on
// the restart, and both nodes finish the job from the last checkpoint.
TEST(ElasticTwoHosts, ALinkCutAndRestoredRestartsBothNodesTogether) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("elastic-cut");
  TwoHosts hosts(tmp.path());
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error();
  const int port = 29600 + ::getpid() % 300 + 11;
  const std::vector<std::string> train = {"--epochs", "20", "--dist-timeout", "3"};
  Process a(hosts.in(hosts.a(), agent("2", port, {"--max-restarts", "2"}, tmp / "w", train)), tmp / "a.log",
            {"OMP_NUM_THREADS=1"});
  Process b(hosts.in(hosts.b(), agent("2", port, {"--max-restarts", "2"}, tmp / "w", train)), tmp / "b.log",
            {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][1/5]", seconds(120))) << a.output() << b.output();
  ASSERT_TRUE(hosts.cut_link());
  std::this_thread::sleep_for(seconds(4));  // the outage itself; no result depends on its length
  ASSERT_TRUE(hosts.restore_link());
  const auto ra = a.wait_for(seconds(240)), rb = b.wait_for(seconds(60));
  ASSERT_TRUE(ra && rb) << a.output() << "\n---\n" << b.output();
  EXPECT_EQ(*ra, 0) << a.output();
  EXPECT_EQ(*rb, 0) << b.output();
  for (const std::string& log : {a.output(), b.output()}) {
    EXPECT_HAS(log, "restarting the worker group with the other nodes (restart 1 of 2)");
    EXPECT_HAS(log, "rendezvous round 1 at tcp://10.77.0.1:" + std::to_string(port));
  }
  EXPECT_HAS(a.output(), "Epoch(test) [20]");
}
