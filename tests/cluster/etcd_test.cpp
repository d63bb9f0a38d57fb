// tandem-run's etcd rendezvous (--rdzv-backend etcd) on three network-namespace hosts with a real
// three-member etcd cluster, one member per host (etcd_hosts.h): losing node rank 0's whole host
// (its tandem-run, its workers, its etcd member) costs one restart, one etcd member lost alone costs
// nothing, and an etcd cluster without quorum ends every agent within its timeout naming the cause.
// The hosts share the work dir (as nodes on a shared file system would). Every run is bounded;
// nothing is timed.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "cluster/etcd_hosts.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

// One node's tandem-run on the etcd rendezvous and its worker (one rank, 6 epochs of 640 digits).
std::vector<std::string> agent(const std::string& nnodes, const std::string& endpoints, const std::string& id,
                               const fs::path& work, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {kRun, "--nnodes", nnodes, "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoints,
                                   "--rdzv-id", id, "--nproc-per-node", "1", "--grace-period", "2", "--max-restarts",
                                   "1", "--rdzv-conf", "last_call_timeout=1,join_timeout=240,timeout=10",
                                   kTrainer, "--launcher", "pytorch", "--data-dir", kDigits, "--limit", "640",
                                   "--test-limit", "128", "--threads", "1", "--log-interval", "1",
                                   "--checkpoint-interval", "3", "--dist-timeout", "20", "--epochs", "6",
                                   "--work-dir", work.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}


int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The three hosts and their etcd cluster, or a skip saying why not.
#define ETCD_HOSTS(tmp, hosts, etcd)                                                          \
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";           \
  TANDEM_NEED_ETCD();                                                                         \
  TANDEM_NEED_DATA(kDigits);                                                                  \
  BridgedHosts hosts(tmp.path(), 3);                                                          \
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error(); \
  EtcdCluster etcd(hosts, tmp.path());                                                        \
  if (const std::string why = etcd.start(); !why.empty()) FAIL() << why

}  // namespace

// --nnodes 2 with a third agent waiting: node rank 0's whole host is SIGKILLed mid-run (its agent,
// its worker that serves the workers' store, its etcd member). The etcd cluster keeps its quorum; the
// node-1 agent records its rank's failure and rejoins; the waiting agent makes round 1 with it, the
// lowest surviving node (host b) now node rank 0 and the workers' store host. The job resumes from the
// last checkpoint at the same world size and ends with the weights of an uninterrupted run, bit for bit.
TEST(EtcdThreeHosts, KillingNodeRankZerosWholeHostCostsOneRestartAndEndsBitwiseLikeAnUninterruptedRun) {
  TempDir tmp("etcd-kill-host");
  ETCD_HOSTS(tmp, hosts, etcd);
  const std::string ep = etcd.endpoints();
  {  // the uninterrupted run, on hosts a and b
    const std::vector<std::string> save = {"--save-weights", tmp.file("full.safetensors")};
    Process a(hosts.in(0, agent("2", ep, "full", tmp / "full", save)), tmp / "full_a.log", {"OMP_NUM_THREADS=1"});
    ASSERT_TRUE(a.wait_for_text("joining the rendezvous at etcd://", seconds(30))) << a.output();
    Process b(hosts.in(1, agent("2", ep, "full", tmp / "full", save)), tmp / "full_b.log", {"OMP_NUM_THREADS=1"});
    const auto ra = a.wait_for(seconds(240)), rb = b.wait_for(seconds(60));
    ASSERT_TRUE(ra && rb) << a.output() << "\n---\n" << b.output();
    ASSERT_EQ(*ra, 0) << a.output();
    ASSERT_EQ(*rb, 0) << b.output();
    EXPECT_HAS(a.output(), "rendezvous round 0 at etcd://" + ep + ": node rank 0 of 2 node(s), world size 2, "
                           "workers' store 10.78.0.1:");
  }
  const std::vector<std::string> save = {"--save-weights", tmp.file("cut.safetensors")};
  Process a(hosts.in(0, agent("2", ep, "cut", tmp / "cut", save)), tmp / "cut_a.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("joining the rendezvous at etcd://", seconds(30))) << a.output();
  Process b(hosts.in(1, agent("2", ep, "cut", tmp / "cut", save)), tmp / "cut_b.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(b.wait_for_text("node rank 1 of 2 node(s)", seconds(60))) << a.output() << "\n---\n" << b.output();
  Process c(hosts.in(2, agent("2", ep, "cut", tmp / "cut", save)), tmp / "cut_c.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(c.wait_for_text("waiting for round 1", seconds(60))) << c.output();
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][1/5]", seconds(120))) << a.output() << "\n---\n" << b.output();
  ASSERT_TRUE(hosts.kill_all(0));
  expect_both_succeed(b, c, seconds(240), seconds(60));
  EXPECT_HAS(b.output(), "restarting the worker group with the other nodes (restart 1 of 1)");
  EXPECT_HAS(b.output(), "rendezvous round 1 at etcd://" + ep + ": node rank 0 of 2 node(s), world size 2, "
                         "workers' store 10.78.0.2:");
  EXPECT_HAS(c.output(), "rendezvous round 1 at etcd://" + ep + ": node rank 1 of 2 node(s), world size 2");
  EXPECT_HAS(b.output(), "restart 1 of the worker group: resuming from the last checkpoint");
  expect_same_weights(tmp / "full.safetensors", tmp / "cut.safetensors");
}

// Three agents of a --nnodes 2 job start at once, five times over (/bin/sh workers): concurrent joins
// never split or overfill a round. Each time exactly two agents get node ranks 0 and 1 in round 0
// (world size 2), and the third waits for round 1 and leaves with exit code 0 once the job succeeded.
TEST(EtcdThreeHosts, ConcurrentJoinsMakeOneRoundOfMaxNodesAndTheSpareLeavesAfterTheJob) {
  TempDir tmp("etcd-concurrent");
  ETCD_HOSTS(tmp, hosts, etcd);
  for (int job = 0; job < 5; ++job) {
    std::vector<Process> agents;
    for (int i = 0; i < 3; ++i)
      agents.emplace_back(hosts.in(i, {kRun, "--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint",
                                       etcd.endpoints(), "--rdzv-id", "concurrent" + std::to_string(job),
                                       "--rdzv-conf", "last_call_timeout=1,join_timeout=60,timeout=10", "/bin/sh",
                                       "-c", "echo \"world $WORLD_SIZE\""}),
                          tmp / ("job" + std::to_string(job) + "_" + std::to_string(i) + ".log"));
    std::string all;
    for (Process& p : agents) {
      const auto rc = p.wait_for(seconds(60));
      ASSERT_TRUE(rc.has_value()) << p.output();
      EXPECT_EQ(*rc, 0) << p.output();
      all += p.output();
    }
    EXPECT_EQ(count_of(all, ": node rank 0 of 2 node(s), world size 2"), 1) << all;
    EXPECT_EQ(count_of(all, ": node rank 1 of 2 node(s), world size 2"), 1) << all;
    EXPECT_EQ(count_of(all, "[rank 0] world 2"), 1) << all;
    EXPECT_EQ(count_of(all, "[rank 1] world 2"), 1) << all;
    EXPECT_EQ(count_of(all, "the job succeeded in round 0 while this node waited to join round 1; leaving"), 1)
        << all;
  }
}

// --nnodes 2:3, three nodes at work: node rank 0's whole host is SIGKILLed mid-run. The two nodes left
// (>= MIN) make round 1, host b now node rank 0 and the workers' store host, and the job finishes at
// world size 2 from the last checkpoint, re-sharded.
TEST(EtcdThreeHosts, ElasticJobLosingNodeRankZerosHostFinishesOnTheOthersAfterOneRestart) {
  TempDir tmp("etcd-elastic");
  ETCD_HOSTS(tmp, hosts, etcd);
  const std::string ep = etcd.endpoints();
  const std::vector<std::string> epochs = {"--epochs", "8"};
  Process a(hosts.in(0, agent("2:3", ep, "elastic", tmp / "w", epochs)), tmp / "a.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("joining the rendezvous at etcd://", seconds(30))) << a.output();
  Process b(hosts.in(1, agent("2:3", ep, "elastic", tmp / "w", epochs)), tmp / "b.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(b.wait_for_text("joining the rendezvous at etcd://", seconds(30))) << b.output();  // before c
  Process c(hosts.in(2, agent("2:3", ep, "elastic", tmp / "w", epochs)), tmp / "c.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("node rank 0 of 3 node(s), world size 3", seconds(60))) << a.output();
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][1/", seconds(120))) << a.output() << "\n---\n" << b.output();
  ASSERT_TRUE(hosts.kill_all(0));
  expect_both_succeed(b, c, seconds(240), seconds(60));
  const std::string both = b.output() + c.output();
  EXPECT_HAS(both, "rendezvous round 1 at etcd://" + ep + ": node rank 0 of 2 node(s), world size 2, workers' store "
                   "10.78.0.2:");
  EXPECT_HAS(both, "rendezvous round 1 at etcd://" + ep + ": node rank 1 of 2 node(s), world size 2");
  EXPECT_HAS(b.output(), "world size changed from 3 to 2: resuming epoch ");  // rank 0's line
  EXPECT_HAS(b.output(), "Epoch(test) [8]");
}

// --nnodes 2 on hosts a and b, a spare on host c, timeout=20 (so each lease lives 10 s): host b's link
// is down for 14 s. Node b's lease expires meanwhile: node a's agent counts node 1 lost, restarts with
// the spare and finishes the job; node b's agent, back on the network, finds its lease gone and ends
// with exit code 1 naming it.
TEST(EtcdThreeHosts, AnAgentCutOffLongerThanItsLeaseIsCountedLostAndEndsNamingIt) {
  TempDir tmp("etcd-lease");
  ETCD_HOSTS(tmp, hosts, etcd);
  const std::string ep = etcd.endpoints();
  auto lease_agent = [&](int host) {
    std::vector<std::string> argv = agent("2", ep, "lease", tmp / "w", {"--epochs", "60", "--dist-timeout", "30"});
    for (std::string& a : argv)
      if (a == "last_call_timeout=1,join_timeout=240,timeout=10") a = "last_call_timeout=1,join_timeout=240,timeout=20";
    return hosts.in(host, argv);
  };
  Process a(lease_agent(0), tmp / "a.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("joining the rendezvous at etcd://", seconds(30))) << a.output();
  Process b(lease_agent(1), tmp / "b.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(b.wait_for_text("node rank 1 of 2 node(s)", seconds(60))) << b.output();
  Process c(lease_agent(2), tmp / "c.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(c.wait_for_text("waiting for round 1", seconds(60))) << c.output();
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][1/5]", seconds(120))) << a.output();
  ASSERT_TRUE(hosts.set_link(1, false));
  std::this_thread::sleep_for(seconds(14));  // longer than the lease's 10 s; no result depends on the length
  ASSERT_TRUE(hosts.set_link(1, true));
  const auto rb = b.wait_for(seconds(120));
  ASSERT_TRUE(rb.has_value()) << b.output();
  EXPECT_EQ(*rb, 1) << b.output();
  EXPECT_HAS(b.output(), "this agent's etcd lease expired");
  EXPECT_HAS(b.output(), "the other agents count this node lost");
  expect_both_succeed(a, c, seconds(240), seconds(60));
  EXPECT_HAS(a.output(), "round 0 lost node 1 (host ");
  EXPECT_HAS(a.output(), "): its agent's etcd lease expired; ending this node's 1 worker(s)");
  EXPECT_HAS(c.output(), "rendezvous round 1 at etcd://" + ep + ": node rank 1 of 2 node(s), world size 2");
}

// --nnodes 2 on hosts a and b: etcd's member on host a (the first endpoint every agent tries) is
// SIGKILLed alone mid-run. The agents go on through the other members: no restart, and the job ends.
// (A leader among them is elected again within etcd's election timeout, well under timeout=10.)
TEST(EtcdThreeHosts, OneEtcdMemberKilledAloneRestartsNothing) {
  TempDir tmp("etcd-kill-member");
  ETCD_HOSTS(tmp, hosts, etcd);
  const std::string ep = etcd.endpoints();
  // 40 epochs: the job runs on for longer than timeout=10 after the kill, so calls that the lost member
  // could not answer would have ended it.
  const std::vector<std::string> epochs = {"--epochs", "40"};
  Process a(hosts.in(0, agent("2", ep, "member", tmp / "w", epochs)), tmp / "a.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("joining the rendezvous at etcd://", seconds(30))) << a.output();  // node rank 0
  Process b(hosts.in(1, agent("2", ep, "member", tmp / "w", epochs)), tmp / "b.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][1/5]", seconds(120))) << a.output() << "\n---\n" << b.output();
  ASSERT_EQ(::kill(etcd.member_process(0).pid(), SIGKILL), 0);
  expect_both_succeed(a, b, seconds(240), seconds(60));
  EXPECT_FALSE(etcd.member_process(0).running());
  for (const std::string& log : {a.output(), b.output()}) {
    EXPECT_EQ(log.find("restarting"), std::string::npos) << log;
    EXPECT_EQ(log.find("rendezvous round 1"), std::string::npos) << log;
  }
  EXPECT_HAS(a.output(), "Epoch(test) [40]");
}

// --nnodes 2 on hosts a and b: two of the three etcd members are SIGKILLed mid-run, so the cluster has
// no quorum (the member left answers, but cannot commit). Each agent ends with exit code 1 within its
// bound (timeout=10: its calls fail for that long), naming the cause; its workers are stopped, and the
// last checkpoint on disk is whole (it loads).
TEST(EtcdThreeHosts, LosingQuorumEndsEveryAgentNamingTheCauseAndKeepsTheLastCheckpoint) {
  TempDir tmp("etcd-quorum");
  ETCD_HOSTS(tmp, hosts, etcd);
  const std::string ep = etcd.endpoints();
  // Epochs enough that the job cannot end by itself within the bound below on any machine: only the lost
  // quorum ends it.
  const std::vector<std::string> epochs = {"--epochs", "100000"};
  Process a(hosts.in(0, agent("2", ep, "quorum", tmp / "w", epochs)), tmp / "a.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("joining the rendezvous at etcd://", seconds(30))) << a.output();  // node rank 0
  Process b(hosts.in(1, agent("2", ep, "quorum", tmp / "w", epochs)), tmp / "b.log", {"OMP_NUM_THREADS=1"});
  ASSERT_TRUE(a.wait_for_text("Epoch(train) [2][1/5]", seconds(120))) << a.output() << "\n---\n" << b.output();
  ASSERT_EQ(::kill(etcd.member_process(1).pid(), SIGKILL), 0);
  ASSERT_EQ(::kill(etcd.member_process(2).pid(), SIGKILL), 0);
  // Bound: timeout=10 counted from the first failed call (each call at most 5 s), the grace period,
  // with margin.
  const auto ra = a.wait_for(seconds(90)), rb = b.wait_for(seconds(30));
  ASSERT_TRUE(ra && rb) << a.output() << "\n---\n" << b.output();
  for (const std::string& log : {a.output(), b.output()}) {
    EXPECT_HAS(log, "the etcd rendezvous at etcd://" + ep + " could not be used for 10 s (timeout)");
    EXPECT_HAS(log, "it has no quorum; bring a majority of its members back up and connected");
  }
  EXPECT_EQ(*ra, 1) << a.output();
  EXPECT_EQ(*rb, 1) << b.output();
  std::ifstream in(tmp / "w" / "last_checkpoint");
  std::string last;
  std::getline(in, last);
  ASSERT_FALSE(last.empty());
  const fs::path file = fs::path(last).is_absolute() ? fs::path(last) : tmp / "w" / last;
  EXPECT_FALSE(weights(file).empty()) << file;
}
