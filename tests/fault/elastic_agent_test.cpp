// tandem-run's multi-node agents on one host (two agents on 127.0.0.1 stand for two nodes; the first
// to bind the rendezvous port serves the store): restarts used up, a round that never gathers MIN
// nodes, a store nobody serves. Small /bin/sh workers; every run is bounded, nothing is timed.
#include <gtest/gtest.h>

#include "fault/fault_util.h"

using namespace tandem::test;

namespace {

std::vector<std::string> agent(const std::string& nnodes, int port, const std::vector<std::string>& extra,
                               const std::string& script) {
  std::vector<std::string> argv = {kRun, "--nnodes", nnodes, "--master-port", std::to_string(port), "--grace-period",
                                   "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  return argv;
}

}  // namespace

// --max-restarts 1: node 1's worker exits 3 in both rounds. Both agents restart once together, then
// both exit 3 naming node 1 and its rank.
TEST(ElasticAgents, RestartsUsedUpEveryAgentExitsWithTheFailedRanksCodeNamingIt) {
  TempDir tmp("elastic-exhausted");
  const int port = free_port();
  const std::string script =
      "echo round $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS world $WORLD_SIZE; "
      "if [ \"$GROUP_RANK\" = 1 ]; then sleep 1; exit 3; fi; sleep 60";
  const std::vector<std::string> extra = {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=1,join_timeout=30"};
  Process n0(agent("2", port, extra, script), tmp / "n0.log");
  ASSERT_TRUE(n0.wait_for_text("serving the rendezvous at tcp://127.0.0.1:" + std::to_string(port), seconds(30)))
      << n0.output();
  Process n1(agent("2", port, extra, script), tmp / "n1.log");
  const auto r0 = n0.wait_for(seconds(60)), r1 = n1.wait_for(seconds(30));
  ASSERT_TRUE(r0 && r1) << n0.output() << "\n---\n" << n1.output();
  EXPECT_EQ(*r0, 3) << n0.output();
  EXPECT_EQ(*r1, 3) << n1.output();
  for (const std::string& log : {n0.output(), n1.output()}) {
    EXPECT_HAS(log, "round 0 of 1 world 2");
    EXPECT_HAS(log, "round 1 of 1 world 2");
    EXPECT_HAS(log, "tandem-run: giving up after 1 restart(s): node 1 (host ");
    EXPECT_HAS(log, "rank 1 failed with exit code 3");
  }
  EXPECT_HAS(n0.output(), "round 1 failed on another node: node 1");
  EXPECT_HAS(n0.output(), "ending this node's 1 worker(s)");
}

// --nnodes 2:2 with one node only: the round never gathers MIN, and the agent says so within the
// join timeout.
TEST(ElasticAgents, TooFewNodesFailWithinTheJoinTimeoutNamingHowManyJoined) {
  TempDir tmp("elastic-join");
  Process n0(agent("2:2", free_port(), {"--rdzv-conf", "join_timeout=2"}, "true"), tmp / "n0.log");
  const auto rc = n0.wait_for(seconds(30));
  ASSERT_TRUE(rc.has_value()) << n0.output();
  EXPECT_EQ(*rc, 1) << n0.output();
  EXPECT_HAS(n0.output(), "tandem-run: error: rendezvous round 0 timed out: 1 of 2 node(s) joined within "
                          "join_timeout=2 s");
}

// Node rank 1 with nobody serving the store: it gives up after its join timeout, naming the address.
TEST(ElasticAgents, AnUnreachableStoreEndsTheAgentNamingItsAddress) {
  TempDir tmp("elastic-nostore");
  const int port = free_port();
  Process n1(agent("2", port, {"--node-rank", "1", "--rdzv-conf", "join_timeout=2"}, "true"), tmp / "n1.log");
  const auto rc = n1.wait_for(seconds(30));
  ASSERT_TRUE(rc.has_value()) << n1.output();
  EXPECT_EQ(*rc, 1) << n1.output();
  EXPECT_HAS(n1.output(), "tandem-run: error: cannot reach the rendezvous store at tcp://127.0.0.1:" +
                              std::to_string(port) + " within join_timeout=2 s");
}

// --nnodes 1:2 with one node: after the last-call window the round closes with that node alone.
TEST(ElasticAgents, OneToTwoNodesStartsAloneAfterTheLastCall) {
  TempDir tmp("elastic-alone");
  Process n0(agent("1:2", free_port(), {"--rdzv-conf", "last_call_timeout=1"},
                   "echo world $WORLD_SIZE group $GROUP_RANK of $GROUP_WORLD_SIZE"),
             tmp / "n0.log");
  const auto rc = n0.wait_for(seconds(30));
  ASSERT_TRUE(rc.has_value()) << n0.output();
  EXPECT_EQ(*rc, 0) << n0.output();
  EXPECT_HAS(n0.output(), "world 1 group 0 of 1");
}

// --nnodes 1:2: node 0 runs alone; a node arriving later waits in round 1, and node 0's agent restarts
// its group so that round 1 takes both (a restart, counted against --max-restarts).
TEST(ElasticAgents, ANodeArrivingLateIsTakenInByTheNextRound) {
  TempDir tmp("elastic-late");
  const int port = free_port();
  const std::string script = "echo round $TORCHELASTIC_RESTART_COUNT world $WORLD_SIZE; "
                             "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then sleep 60; fi";
  const std::vector<std::string> extra = {"--max-restarts", "1", "--rdzv-conf", "last_call_timeout=0.5"};
  Process n0(agent("1:2", port, extra, script), tmp / "n0.log");
  ASSERT_TRUE(n0.wait_for_text("round 0 world 1", seconds(30))) << n0.output();
  Process n1(agent("1:2", port, extra, script), tmp / "n1.log");
  const auto r1 = n1.wait_for(seconds(60)), r0 = n0.wait_for(seconds(30));
  ASSERT_TRUE(r0 && r1) << n0.output() << "\n---\n" << n1.output();
  EXPECT_EQ(*r0, 0) << n0.output();
  EXPECT_EQ(*r1, 0) << n1.output();
  EXPECT_HAS(n0.output(), "1 agent(s) wait in rendezvous round 1 while round 0 runs 1 of at most 2 node(s)");
  EXPECT_HAS(n0.output(), "round 1 world 2");
  EXPECT_HAS(n1.output(), "rendezvous round 0 closed before this node joined; waiting for round 1");
  EXPECT_HAS(n1.output(), "node rank 1 of 2 node(s), world size 2");
}

// SIGTERM to an agent that waits in the rendezvous ends the wait at once: exit 128 + 15.
TEST(ElasticAgents, SigtermWhileWaitingInTheRendezvousEndsTheAgent) {
  TempDir tmp("elastic-sigterm");
  Process n0(agent("2", free_port(), {"--rdzv-conf", "join_timeout=60"}, "true"), tmp / "n0.log");
  ASSERT_TRUE(n0.wait_for_text("serving the rendezvous at", seconds(30))) << n0.output();
  ASSERT_EQ(::kill(n0.pid(), SIGTERM), 0);
  const auto rc = n0.wait_for(seconds(10));
  ASSERT_TRUE(rc.has_value()) << n0.output();
  EXPECT_EQ(*rc, 143) << n0.output();
  EXPECT_HAS(n0.output(), "received signal 15 during the rendezvous; stopping");
}
