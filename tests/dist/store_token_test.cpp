// The token of a multi-node job's stores (apps/tandem-run/token.h), driven through real tandem-run
// launches of two nodes on this machine (c10d rendezvous, /bin/sh workers): --rdzv-id, or
// TANDEM_STORE_TOKEN when set, is the rendezvous store's token and the workers' TANDEM_STORE_TOKEN; a
// client of another job is refused in the handshake, before it can read or write a key, while the
// job goes on; a job with neither warns once per node, naming the flag. Every launch is bounded;
// nothing is timed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/test_util.h"
#include "core/error.h"
#include "dist/store/tcp_store.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

const std::string kLauncher = TANDEM_BINARY_DIR "/apps/tandem-run";

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Node `rank` of a 2-node job whose rendezvous store is 127.0.0.1:`port`; each worker runs `script`.
std::vector<std::string> node(int rank, int port, const std::vector<std::string>& extra, const std::string& script) {
  std::vector<std::string> argv = {kLauncher,       "--nnodes",      "2",  "--node-rank", std::to_string(rank),
                                   "--master-addr", "127.0.0.1",     "--master-port", std::to_string(port),
                                   "--rdzv-conf",   "join_timeout=60,timeout=20"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  return argv;
}

// The error text of constructing a client of the store at 127.0.0.1:`port` presenting `token`, or "".
std::string connect_error(int port, const std::string& token) {
  tandem::dist::TCPStoreOptions o;
  o.timeout = std::chrono::seconds(10);
  o.token = token;
  try {
    tandem::dist::TCPStore client("127.0.0.1", port, false, o);
    return "";
  } catch (const tandem::Error& e) {
    return e.what();
  }
}

}  // namespace

// --rdzv-id job-a: the workers see TANDEM_STORE_TOKEN=job-a; while they run, a client presenting
// another job's token, and one presenting none, are both refused by the rendezvous store in the
// handshake (its constructor fails: no key can be read or written), the store's host says so, and the
// job ends with exit code 0 on both nodes.
TEST(StoreToken, AForeignClientIsRefusedBeforeAnyKeyWhileTheJobGoesOn) {
  TempDir tmp("store-token");
  const int port = free_port();
  const std::string script = "echo \"$TANDEM_STORE_TOKEN\" > " + tmp.file("token_") + "$RANK; touch " +
                             tmp.file("ready_") + "$RANK; i=0; while [ ! -e " + tmp.file("go") +
                             " ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done";
  Process a(node(0, port, {"--rdzv-id", "job-a"}, script), tmp / "a.log");
  Process b(node(1, port, {"--rdzv-id", "job-a"}, script), tmp / "b.log");
  ASSERT_TRUE(eventually([&] { return fs::exists(tmp / "ready_0") && fs::exists(tmp / "ready_1"); }))
      << a.output() << "\n---\n" << b.output();
  const std::string other = connect_error(port, "job-b");
  EXPECT_HAS(other, "refused this client: this process's token does not match the server's");
  const std::string none = connect_error(port, "");
  EXPECT_HAS(none, "refused this client: the server requires a shared token and this process has none");
  EXPECT_EQ(connect_error(port, "job-a"), "");  // the job's own token is taken
  std::ofstream(tmp / "go").put('\n');
  const auto ra = a.wait_for(seconds(60)), rb = b.wait_for(seconds(60));
  ASSERT_TRUE(ra && rb) << a.output() << "\n---\n" << b.output();
  EXPECT_EQ(*ra, 0) << a.output();
  EXPECT_EQ(*rb, 0) << b.output();
  EXPECT_EQ(read_file(tmp / "token_0"), "job-a\n");
  EXPECT_EQ(read_file(tmp / "token_1"), "job-a\n");
  EXPECT_EQ(count(a.output(), "tandem-run: rendezvous store: TCPStore server tcp://127.0.0.1:" + std::to_string(port) +
                                  ": refused the client at 127.0.0.1:"),
            2)
      << a.output();
  EXPECT_EQ(a.output().find("warning: this multi-node job's stores take any client"), std::string::npos);
}

// Without --rdzv-id and TANDEM_STORE_TOKEN (as tools/dist_train.sh's multi-node command runs) the job
// runs as before, each node warning once and naming --rdzv-id; the workers get no token. With
// TANDEM_STORE_TOKEN set, that is the token (over --rdzv-id) and nothing is said. One node never warns.
TEST(StoreToken, AMultiNodeJobWithoutIdOrTokenWarnsOnceNamingTheFlag) {
  TempDir tmp("store-token-warn");
  const std::string script = "echo \"${TANDEM_STORE_TOKEN:-none}\" > " + tmp.file("token_") + "$RANK";
  int port = free_port();
  {
    Process a(node(0, port, {}, script), tmp / "a.log", {"TANDEM_STORE_TOKEN"});
    Process b(node(1, port, {}, script), tmp / "b.log", {"TANDEM_STORE_TOKEN"});
    const auto ra = a.wait_for(seconds(60)), rb = b.wait_for(seconds(60));
    ASSERT_TRUE(ra && rb) << a.output() << "\n---\n" << b.output();
    EXPECT_EQ(*ra, 0) << a.output();
    EXPECT_EQ(*rb, 0) << b.output();
    for (const std::string& log : {a.output(), b.output()})
      EXPECT_EQ(count(log, "tandem-run: warning: this multi-node job's stores take any client that can reach them: "
                           "give every node the same --rdzv-id (or set TANDEM_STORE_TOKEN)"),
                1)
          << log;
    EXPECT_EQ(read_file(tmp / "token_0"), "none\n");
  }
  port = free_port();
  {
    Process a(node(0, port, {"--rdzv-id", "job-c"}, script), tmp / "a2.log", {"TANDEM_STORE_TOKEN=secret-c"});
    Process b(node(1, port, {"--rdzv-id", "job-c"}, script), tmp / "b2.log", {"TANDEM_STORE_TOKEN=secret-c"});
    const auto ra = a.wait_for(seconds(60)), rb = b.wait_for(seconds(60));
    ASSERT_TRUE(ra && rb) << a.output() << "\n---\n" << b.output();
    EXPECT_EQ(*ra, 0) << a.output();
    EXPECT_EQ(*rb, 0) << b.output();
    EXPECT_EQ(a.output().find("warning: this multi-node"), std::string::npos) << a.output();
    EXPECT_EQ(read_file(tmp / "token_1"), "secret-c\n");
  }
  Process one({kLauncher, "--master-port", std::to_string(free_port()), "/bin/sh", "-c", script}, tmp / "one.log",
              {"TANDEM_STORE_TOKEN"});
  ASSERT_EQ(one.wait_for(seconds(60)).value_or(-1), 0) << one.output();
  EXPECT_EQ(one.output().find("warning: this multi-node"), std::string::npos) << one.output();
}
