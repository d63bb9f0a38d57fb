// Real multi-host runs without a second machine: two network namespaces joined by a veth pair
// (10.77.0.1/24 in the first, 10.77.0.2/24 in the second; the addresses exist only inside the
// namespaces), one tandem-run per "node" (--nnodes 2, one process each). First a job that must
// finish; then a job whose link is cut mid-run, where both sides must fail within their timeout
// with a clear message. The namespaces (and with them the veth pair) are removed by a guard,
// also on failure. Skips with the reason where namespaces cannot be created (not root, no
// iproute2, a sandbox without netns). TANDEM_TEST_SHOW_OUTPUT=1 prints both sides' output of the
// cut run (to see the messages).
#include <gtest/gtest.h>

#include "cluster/two_hosts.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

std::vector<std::string> node(int node_rank, int port, const fs::path& work,
                              const std::vector<std::string>& train) {
  std::vector<std::string> argv = {kRun,
                                   "--nnodes",
                                   "2",
                                   "--node-rank",
                                   std::to_string(node_rank),
                                   "--master-addr",
                                   TwoHosts::kAddrA,
                                   "--master-port",
                                   std::to_string(port),
                                   "--nproc-per-node",
                                   "1",
                                   // the agents' store calls: bounded like the workers' collectives
                                   "--rdzv-conf",
                                   "timeout=5",
                                   kTrainer,
                                   "--launcher",
                                   "pytorch",
                                   "--data-dir",
                                   kDigits,
                                   "--test-limit",
                                   "500",
                                   "--log-interval",
                                   "10",
                                   "--work-dir",
                                   work.string()};
  argv.insert(argv.end(), train.begin(), train.end());
  return argv;
}

}  // namespace

TEST(TwoHostsOverVeth, JobCompletesThenACutLinkFailsBothSidesWithinTheTimeout) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("netns");
  {
    TwoHosts hosts(tmp.path());
    if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error();

    // 1. A 2-node job over the veth link runs to completion.
    {
      const int port = 29600 + ::getpid() % 300;
      Process n0(hosts.in(hosts.a(), node(0, port, tmp / "w0",
                                          {"--epochs", "1", "--limit", "2000", "--dist-timeout", "30"})),
                 tmp / "ok0.log", {"OMP_NUM_THREADS=1"});
      Process n1(hosts.in(hosts.b(), node(1, port, tmp / "w1",
                                          {"--epochs", "1", "--limit", "2000", "--dist-timeout", "30"})),
                 tmp / "ok1.log", {"OMP_NUM_THREADS=1"});
      const auto rc0 = n0.wait_for(seconds(120)), rc1 = n1.wait_for(seconds(30));
      ASSERT_TRUE(rc0 && rc1) << n0.output() << "\n---\n" << n1.output();
      EXPECT_EQ(*rc0, 0) << n0.output();
      EXPECT_EQ(*rc1, 0) << n1.output();
      EXPECT_HAS(n0.output(), "distributed: 2 ranks over gloo");
      EXPECT_HAS(n0.output(), "Epoch(test) [1]");
    }

    // 2. The link goes down mid-run: no RST ever arrives, so only timeouts can end it. Each side
    // must fail by itself within the bound, naming the operation (and what it knows of the peer).
    {
      const int port = 29600 + ::getpid() % 300 + 1;
      const std::vector<std::string> train = {"--epochs", "50", "--dist-timeout", "3"};
      Process n0(hosts.in(hosts.a(), node(0, port, tmp / "c0", train)), tmp / "cut0.log",
                 {"OMP_NUM_THREADS=1"});
      Process n1(hosts.in(hosts.b(), node(1, port, tmp / "c1", train)), tmp / "cut1.log",
                 {"OMP_NUM_THREADS=1"});
      ASSERT_TRUE(n0.wait_for_text("Epoch(train) [1][10/", seconds(120))) << n0.output() << n1.output();
      ASSERT_TRUE(hosts.cut_link());
      // Bound: 3 s collective timeout + diagnosis + a store call that cannot be answered
      // (3 s + 2 s) + the launcher's grace + the agent's own store call about the failure (5 s + 2 s),
      // with margin for a loaded machine.
      const auto rc0 = n0.wait_for(seconds(45)), rc1 = n1.wait_for(seconds(45));
      ASSERT_TRUE(rc0.has_value()) << "node 0 still running:\n" << n0.output();
      ASSERT_TRUE(rc1.has_value()) << "node 1 still running:\n" << n1.output();
      EXPECT_EQ(*rc0, 1) << n0.output();
      EXPECT_EQ(*rc1, 1) << n1.output();
      const std::string o0 = n0.output(), o1 = n1.output();
      if (std::getenv("TANDEM_TEST_SHOW_OUTPUT")) std::cerr << o0 << "\n---\n" << o1 << "\n";
      // The collective that times out is a bucket's all-reduce or the stop agreement after the step
      // (then the message says so first); either names the group and the rank.
      EXPECT_HAS(o0, "[rank 0] tandem-mnist: error: ");
      EXPECT_HAS(o0, "ProcessGroupGloo rank 0 of 2: ");
      EXPECT_HAS(o1, "[rank 1] tandem-mnist: error: ");
      EXPECT_HAS(o0, "tandem-run: rank 0 (local rank 0");
      EXPECT_HAS(o1, "tandem-run: rank 1 (local rank 0");
      // Rank 0 still reaches the store (it serves it): it names rank 1 as the silent peer.
      EXPECT_HAS(o0, "peer rank 1 never reached this collective");
      // Rank 1 cannot reach anything on the other side: its message names the store's address
      // or its collective's timeout.
      const bool clear1 = o1.find("tcp://10.77.0.1:" + std::to_string(port)) != std::string::npos ||
                          o1.find("Timed out") != std::string::npos ||
                          o1.find("did not complete within") != std::string::npos;
      EXPECT_TRUE(clear1) << o1;
    }
  }
  // The guard removed both namespaces.
  TempDir check("netns");
  std::string list;
  ASSERT_EQ(sh("ip netns list", check / "l.log", &list), 0);
  const std::string tag = "td" + std::to_string(::getpid() % 100000);
  EXPECT_EQ(list.find(tag + "a"), std::string::npos) << list;
  EXPECT_EQ(list.find(tag + "b"), std::string::npos) << list;
}

// MMRazor's multi-node command, one per "node": NNODES=2 NODE_RANK=i PORT=... MASTER_ADDR=...
// sh tools/dist_train.sh CONFIG 1, each in its own network namespace.
TEST(TwoHostsOverVeth, DistTrainShWithTwoNodes) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("netns-dist-train");
  TwoHosts hosts(tmp.path());
  if (!hosts.ok()) GTEST_SKIP() << "cannot create network namespaces here: " << hosts.error();
  const int port = 29600 + ::getpid() % 300 + 2;
  auto node_cmd = [&](int rank) {
    return hosts.in(rank == 0 ? hosts.a() : hosts.b(),
                    {"/bin/sh", TANDEM_SOURCE_DIR "/tools/dist_train.sh", TANDEM_SOURCE_DIR "/configs/mnist_ddp.json",
                     "1", "--data-dir", kDigits, "--limit", "1000", "--test-limit", "500", "--epochs", "1",
                     "--work-dir", (tmp / ("w" + std::to_string(rank))).string(), "--dist-timeout", "30"});
  };
  auto env = [&](int rank) {
    return std::vector<std::string>{"OMP_NUM_THREADS=1", "NNODES=2", "NODE_RANK=" + std::to_string(rank),
                                    "PORT=" + std::to_string(port), std::string("MASTER_ADDR=") + TwoHosts::kAddrA,
                                    "TANDEM_BIN=" TANDEM_BINARY_DIR "/apps", "CUDA_VISIBLE_DEVICES=-1"};
  };
  Process n0(node_cmd(0), tmp / "n0.log", env(0));
  Process n1(node_cmd(1), tmp / "n1.log", env(1));
  const auto rc0 = n0.wait_for(seconds(120)), rc1 = n1.wait_for(seconds(30));
  ASSERT_TRUE(rc0 && rc1) << n0.output() << "\n---\n" << n1.output();
  EXPECT_EQ(*rc0, 0) << n0.output();
  EXPECT_EQ(*rc1, 0) << n1.output();
  EXPECT_HAS(n0.output(), "distributed: 2 ranks over gloo");
  // The agents meet at PORT; node 0 hands its workers a free port of its own for their store.
  EXPECT_HAS(n0.output(), std::string("rendezvous round 0 at tcp://") + TwoHosts::kAddrA + ":" + std::to_string(port));
  EXPECT_HAS(n0.output(), std::string("store ") + TwoHosts::kAddrA + ":");
  EXPECT_HAS(n0.output(), "Epoch(test) [1]");
  // The command passes no --rdzv-id: its stores have no token, and each node says so once.
  for (const std::string& log : {n0.output(), n1.output()})
    EXPECT_HAS(log, "tandem-run: warning: this multi-node job's stores take any client that can reach them: give "
                    "every node the same --rdzv-id (or set TANDEM_STORE_TOKEN)");
}
