// The rendezvous store's server vanishing under its clients. The server lives in another process
// (tandem-mnist as rank 0 of a 2-rank job that never gets its rank 1: it serves the store while
// it waits), so killing it is a real process death; the clients are TCPStore instances in this
// test process. Asserts that every client call then fails within its own timeout (plus the
// reply allowance) with a tandem::Error naming the store's address, and never hangs.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>

#include "dist/store/tcp_store.h"
#include "fault/fault_util.h"
#include "common/require_data.h"

using namespace tandem;
using namespace tandem::dist;
using namespace tandem::test;

namespace {

// Runs f on a helper thread; returns its tandem::Error message, "" on success, or "HUNG" when it
// did not finish within `limit` (the thread is then left to finish on its own bound).
std::string error_within(const std::function<void()>& f, milliseconds limit) {
  auto result = std::make_shared<std::pair<std::atomic<bool>, std::string>>();
  result->first = false;
  std::thread t([result, f] {
    try {
      f();
    } catch (const Error& e) {
      result->second = e.what();
    }
    result->first = true;
  });
  if (!eventually([&] { return result->first.load(); }, limit)) {
    t.detach();
    return "HUNG";
  }
  t.join();
  return result->second;
}

}  // namespace

TEST(StoreServerGone, ClientsFailWithinTheirTimeoutNamingTheStoreAddress) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("fault");
  const int port = free_port();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  Process server({kTrainer, "--launcher", "pytorch", "--data-dir", kDigits, "--limit", "64", "--dist-timeout",
                  "120", "--work-dir", (tmp / "work").string()},
                 tmp / "server.log",
                 {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0",
                  "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)});
  ASSERT_TRUE(server.started());
  TCPStoreOptions opts;
  // Connecting retries until the server listens (it starts within the 2 s, usually at once).
  opts.timeout = std::chrono::seconds(30);
  TCPStore a("127.0.0.1", port, false, opts);
  a.set_timeout(std::chrono::seconds(2));
  a.set_string("fault/key", "value");
  EXPECT_EQ(a.get_string("fault/key"), "value");

  // One client is blocked in get() on a key nobody sets when the server dies.
  std::string blocked_error;
  std::thread blocked([&] {
    blocked_error = error_of([&] {
      TCPStoreOptions o;
      o.timeout = std::chrono::seconds(3);
      TCPStore b("127.0.0.1", port, false, o);
      b.get("fault/never-set");
    });
  });
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_EQ(::kill(server.pid(), SIGKILL), 0);
  ASSERT_TRUE(server.wait_for(seconds(10)).has_value());
  blocked.join();  // bounded by its 3 s timeout + the reply allowance
  EXPECT_HAS(blocked_error, "tcp://" + addr);

  // Later calls of a connected client fail within 2 s (+2 s reply allowance), naming the store.
  std::string e = error_within([&] { a.get("fault/other"); }, seconds(10));
  EXPECT_NE(e, "HUNG");
  EXPECT_HAS(e, "tcp://" + addr);
  e = error_within([&] { a.set_string("fault/x", "y"); }, seconds(10));
  EXPECT_NE(e, "HUNG");
  EXPECT_HAS(e, "tcp://" + addr);
  // A new client cannot connect: it gives up after its timeout, naming the address.
  e = error_within(
      [&] {
        TCPStoreOptions o;
        o.timeout = std::chrono::seconds(2);
        TCPStore c("127.0.0.1", port, false, o);
      },
      seconds(10));
  EXPECT_NE(e, "HUNG");
  EXPECT_HAS(e, "could not connect to tcp://" + addr);
}
