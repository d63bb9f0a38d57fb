// Rendezvous stores across real processes: TCPStore and FileStore operations
// from forked ranks, timeouts that name their keys, a TCPStore server that
// survives garbage, oversized lengths, wrong magic/version and vanished
// clients, exact totals from 64 concurrent clients, PrefixStore isolation, and
// clear errors for a port in use or a server that never comes up.
// Children (common/process.h) report through their exit status (and stderr);
// every wait is bounded, and the parent kills children that outlive kChildLimit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/process.h"
#include "common/test_util.h"
#include "core/error.h"
#include "dist/raw_socket.h"
#include "dist/store/file_store.h"
#include "dist/store/prefix_store.h"
#include "dist/store/tcp_store.h"
#include "dist/store/tcp_store_wire.h"

using namespace tandem;
using namespace tandem::dist;
using namespace std::chrono_literals;
using tandem::test::RawSocket;

namespace {

constexpr auto kChildLimit = 60s;
constexpr Millis kShort = 200ms;   // for timeouts the test expects to fire
constexpr Millis kLong = 20000ms;  // for waits the test expects to succeed

// Throws tandem::Error (in a child: ends it with a non-zero status) unless cond.
void require(bool cond, const std::string& what) {
  if (!cond) throw Error("requirement failed: " + what);
}

// Forks n children running body(i) (common/process.h) and returns their exit statuses. They start
// together once all are forked, so no fork happens while a store server thread in this process
// is busy serving them; those still running after kChildLimit are killed.
std::vector<int> run_children(int n, const std::function<void(int)>& body) {
  std::vector<test::Process> children = test::fork_children(n, [&](int i) {
    body(i);
    return 0;
  });
  if (!test::wait_all(children, kChildLimit))
    ADD_FAILURE() << "children still running after " << kChildLimit.count() << " s; killed";
  std::vector<int> codes;
  for (const test::Process& c : children) codes.push_back(c.status().value_or(-1));
  return codes;
}

void expect_all_zero(const std::vector<int>& codes) {
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "child " << i;
}

// Runs f, expecting tandem::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected tandem::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// A port no one listens on, held bound (without listen) so that nobody takes it
// while held: connecting to it is refused. release() frees it for a server.
struct ReservedPort {
  int fd = -1;
  int port = 0;
  ReservedPort() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw Error("bind failed");
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  void release() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ~ReservedPort() { release(); }
};

std::vector<uint8_t> le32(uint32_t v) {
  return {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
}
std::vector<uint8_t> cat(std::vector<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
// A handshake; the current version carries a token (empty here).
std::vector<uint8_t> hello(uint32_t magic = tcp_store_protocol::kMagic,
                           uint32_t version = tcp_store_protocol::kVersion) {
  if (version == tcp_store_protocol::kVersion) return cat({le32(magic), le32(version), le32(0)});
  return cat({le32(magic), le32(version)});
}
// Reads the 9-byte handshake reply; fails the test when it does not come.
void read_hello_reply(RawSocket& s) {
  uint8_t buf[9];
  size_t got = 0;
  while (got < sizeof(buf)) {
    pollfd pf{s.fd, POLLIN, 0};
    ASSERT_GT(::poll(&pf, 1, 10000), 0) << "no handshake reply";
    ssize_t n = ::recv(s.fd, buf + got, sizeof(buf) - got, 0);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  EXPECT_EQ(buf[8], 0) << "handshake not accepted";
}

TCPStoreOptions opts(Millis timeout) {
  TCPStoreOptions o;
  o.timeout = timeout;
  return o;
}

// The store kinds the cross-process tests run over. make_main() is the store
// living in the test process (the TCP server); make_peer() is what a child opens.
struct Kind {
  std::string name;
  std::function<std::shared_ptr<Store>(Millis)> make_main;
  std::function<std::shared_ptr<Store>(Millis)> make_peer;
};

class StoreKinds : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "tcp") {
      auto server = std::make_shared<TCPStore>("127.0.0.1", 0, true, opts(kLong));
      int port = server->port();
      main_ = server;
      peer_ = [port](Millis t) { return std::make_shared<TCPStore>("127.0.0.1", port, false, opts(t)); };
    } else {
      std::string path = dir_.file("store");
      main_ = std::make_shared<FileStore>(path, -1, kLong);
      peer_ = [path](Millis t) { return std::make_shared<FileStore>(path, -1, t); };
    }
  }
  void TearDown() override { main_.reset(); }
  test::TempDir dir_{"store"};
  std::shared_ptr<Store> main_;
  std::function<std::shared_ptr<Store>(Millis)> peer_;
};

}  // namespace

// ---------------- both kinds ----------------

TEST_P(StoreKinds, OperationsAcrossThreeProcesses) {
  auto codes = run_children(3, [&](int r) {
    auto s = peer_(kLong);
    const std::string me = "rank/" + std::to_string(r);
    s->set_string(me, "value-" + std::to_string(r));
    s->add("counter", r + 1);
    s->wait({"rank/0", "rank/1", "rank/2"});
    for (int o = 0; o < 3; ++o)
      require(s->get_string("rank/" + std::to_string(o)) == "value-" + std::to_string(o), "value of rank " +
              std::to_string(o));
    require(s->check({"rank/0", "rank/1", "rank/2"}), "check of present keys");
    require(!s->check({"rank/0", "never-set"}), "check with a missing key");
    // A get that blocks until another process sets the key.
    if (r == 1) {
      s->set_string("r1-waiting", "1");
      require(s->get_string("late") == "arrived", "blocking get");
    }
    if (r == 2) {
      s->wait({"r1-waiting"});
      s->set_string("late", "arrived");
    }
    // Barrier, then every rank deletes its own key.
    if (s->add("arrived", 1) == 3) s->set_string("all-arrived", "1");
    s->wait({"all-arrived"});
    require(s->get_string("counter") == "6", "counter after all adds is " + s->get_string("counter"));
    require(s->delete_key(me), "delete of an existing key returns true");
    require(!s->delete_key(me), "second delete returns false");
  });
  expect_all_zero(codes);
  EXPECT_EQ(main_->add("counter", 0), 6);
  EXPECT_EQ(main_->get_string("late"), "arrived");
  EXPECT_FALSE(main_->check({"rank/0"}));
  EXPECT_FALSE(main_->check({"rank/1"}));
  EXPECT_FALSE(main_->check({"rank/2"}));
  EXPECT_FALSE(main_->delete_key("never-set"));
  // Values are bytes: zeros and high bytes survive.
  Bytes binary = {0, 1, 255, 0, 128};
  main_->set("bin", binary);
  auto peer = peer_(kLong);
  EXPECT_EQ(peer->get("bin"), binary);
  main_->set("empty", {});
  EXPECT_EQ(peer->get("empty"), Bytes{});
  EXPECT_EQ(peer->add("neg", -5), -5);
  EXPECT_EQ(main_->add("neg", 2), -3);
}

TEST_P(StoreKinds, GetOfMissingKeyTimesOutNamingKey) {
  auto s = peer_(kShort);
  expect_error([&] { s->get("absent-key"); }, {"absent-key", s->address(), "timed out"});
  s->set_string("present", "1");
  try {
    s->wait({"present", "missing-one"}, kShort);
    ADD_FAILURE() << "wait should time out";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'missing-one'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("'present'"), std::string::npos) << "names a key that exists: " << msg;
  }
  // The store still works after timeouts.
  s->set_string("after", "ok");
  EXPECT_EQ(s->get_string("after"), "ok");
}

TEST_P(StoreKinds, AddOnNonIntegerValueNamesKey) {
  main_->set_string("text", "hello");
  expect_error([&] { main_->add("text", 1); }, {"text", "integer"});
  EXPECT_EQ(main_->add("fresh", 7), 7);
}

TEST_P(StoreKinds, ConcurrentAddsGiveExactTotal) {
  constexpr int kProcs = 8, kAdds = 40;
  auto codes = run_children(kProcs, [&](int r) {
    auto s = peer_(kLong);
    for (int i = 0; i < kAdds; ++i) s->add("total", r + 1);
  });
  expect_all_zero(codes);
  EXPECT_EQ(main_->add("total", 0), int64_t{kAdds} * kProcs * (kProcs + 1) / 2);
}

TEST_P(StoreKinds, PrefixStoresAreIsolated) {
  auto a = std::make_shared<PrefixStore>("a", main_);
  PrefixStore b("b", main_);
  a->set_string("k", "from-a");
  EXPECT_FALSE(b.check({"k"}));
  b.set_string("k", "from-b");
  EXPECT_EQ(a->get_string("k"), "from-a");
  EXPECT_EQ(b.get_string("k"), "from-b");
  EXPECT_EQ(main_->get_string("a/k"), "from-a");
  EXPECT_FALSE(main_->check({"k"}));
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 5);
  EXPECT_EQ(a->add("n", 1), 3);
  EXPECT_TRUE(a->delete_key("k"));
  EXPECT_FALSE(a->check({"k"}));
  EXPECT_TRUE(b.check({"k"}));
  // Nested prefixes compose; a timeout names the full key.
  PrefixStore ab("b", a);
  ab.set_string("x", "1");
  EXPECT_EQ(main_->get_string("a/b/x"), "1");
  b.set_timeout(kShort);
  expect_error([&] { b.get("missing"); }, {"b/missing"});
  expect_error([&] { b.wait({"missing2"}, kShort); }, {"b/missing2"});
  EXPECT_EQ(b.address(), main_->address() + "/b");
  // Across processes, too.
  auto codes = run_children(1, [&](int) {
    PrefixStore pb("b", peer_(kLong));
    require(pb.get_string("k") == "from-b", "prefix get in a child");
    pb.set_string("child", "yes");
  });
  expect_all_zero(codes);
  EXPECT_EQ(b.get_string("child"), "yes");
  EXPECT_FALSE(a->check({"child"}));
}

INSTANTIATE_TEST_SUITE_P(Store, StoreKinds, ::testing::Values("tcp", "file"),
                         [](const auto& info) { return info.param; });

// ---------------- TCPStore ----------------

TEST(TCPStore, AddressAndBoundPort) {
  TCPStore server("127.0.0.1", 0, true, opts(kLong));
  EXPECT_GT(server.port(), 0);
  EXPECT_TRUE(server.is_server());
  EXPECT_EQ(server.address(), "tcp://127.0.0.1:" + std::to_string(server.port()));
  TCPStore client("127.0.0.1", server.port(), false, opts(kLong));
  EXPECT_FALSE(client.is_server());
  client.set_string("k", "v");
  EXPECT_EQ(server.get_string("k"), "v");
}

TEST(TCPStore, SixtyFourConcurrentClientsAddExactly) {
  TCPStore server("127.0.0.1", 0, true, opts(kLong));
  const int port = server.port();
  constexpr int kClients = 64, kAdds = 25;
  auto codes = run_children(kClients, [&](int r) {
    TCPStore s("127.0.0.1", port, false, opts(kLong));
    // All 64 connect, then all add at once.
    if (s.add("ready", 1) == kClients) s.set_string("go", "1");
    s.wait({"go"});
    for (int i = 0; i < kAdds; ++i) s.add("sum", r + 1);
  });
  expect_all_zero(codes);
  EXPECT_EQ(server.add("ready", 0), kClients);
  EXPECT_EQ(server.add("sum", 0), int64_t{kAdds} * kClients * (kClients + 1) / 2);
}

TEST(TCPStore, PortInUseIsOneClearError) {
  TCPStore first("127.0.0.1", 0, true, opts(kLong));
  const std::string addr = "127.0.0.1:" + std::to_string(first.port());
  expect_error([&] { TCPStore second("127.0.0.1", first.port(), true, opts(kShort)); }, {addr, "in use"});
  // The first server is unaffected.
  first.set_string("k", "v");
  EXPECT_EQ(first.get_string("k"), "v");
}

TEST(TCPStore, ClientWithoutServerFailsNamingHostPort) {
  ReservedPort nobody;  // bound, never listening: connections are refused
  const std::string addr = "127.0.0.1:" + std::to_string(nobody.port);
  expect_error([&] { TCPStore c("127.0.0.1", nobody.port, false, opts(kShort)); }, {addr, "could not connect"});
  // The same from a separate process (a rank whose rank 0 never started).
  int port = nobody.port;
  auto codes = run_children(1, [&](int) {
    try {
      TCPStore c("127.0.0.1", port, false, opts(kShort));
    } catch (const Error& e) {
      require(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)) != std::string::npos,
              "error names host:port");
      ::_exit(7);
    }
  });
  ASSERT_EQ(codes.size(), 1u);
  EXPECT_EQ(codes[0], 7);
}

TEST(TCPStore, ClientRetriesUntilServerStarts) {
  ReservedPort reserved;
  const int port = reserved.port;
  reserved.release();
  // The child starts first and retries; the parent's server comes up a moment later.
  test::Process child = test::Process::fork([&] {
    TCPStore c("127.0.0.1", port, false, opts(kLong));
    c.set_string("child", "connected");
    return 0;
  });
  ASSERT_TRUE(child.started());
  std::this_thread::sleep_for(50ms);
  TCPStore server("127.0.0.1", port, true, opts(kLong));
  EXPECT_EQ(server.get_string("child"), "connected");
  EXPECT_EQ(child.finish(kChildLimit), 0);
}

// A client whose connect lands on its own source port (TCP's simultaneous open, possible on one host
// for a port of the ephemeral range where nothing listens yet) would read its own requests back as
// replies; the client recognises such a socket and retries (dist/store/tcp_store.cpp connect_one).
// Forced here by binding the socket to the port it connects to; a connection to a real server is not
// taken for one.
TEST(TCPStore, ASocketConnectedToItselfIsRecognised) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  ASSERT_EQ(::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr), 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
  EXPECT_TRUE(dist::tcp_store_wire::connected_to_itself(fd));
  ::close(fd);

  TCPStore server("127.0.0.1", 0, true, opts(kLong));
  const int peer = test::raw_connect("127.0.0.1", server.port());
  ASSERT_GE(peer, 0);
  EXPECT_FALSE(dist::tcp_store_wire::connected_to_itself(peer));
  ::close(peer);
}

TEST(TCPStore, MalformedAndVanishedClientsDoNotStopServer) {
  TCPStore server("127.0.0.1", 0, true, opts(kLong));
  const int port = server.port();
  {
    RawSocket garbage(port);  // bytes that are not our protocol at all
    garbage.send_bytes({'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1', '.', '1', '\r', '\n'});
    EXPECT_TRUE(garbage.read_until_closed());
  }
  {
    RawSocket huge(port);  // a valid handshake, then a length far beyond the limit
    huge.send_bytes(hello());
    read_hello_reply(huge);
    huge.send_bytes(le32(0xFFFFFFF0u));
    EXPECT_TRUE(huge.read_until_closed());
  }
  {
    RawSocket zero(port);  // a zero-length request
    zero.send_bytes(hello());
    read_hello_reply(zero);
    zero.send_bytes(le32(0));
    EXPECT_TRUE(zero.read_until_closed());
  }
  {
    RawSocket unknown(port);  // an unknown op code
    unknown.send_bytes(hello());
    read_hello_reply(unknown);
    unknown.send_bytes(cat({le32(3), {200, 1, 2}}));
    EXPECT_TRUE(unknown.read_until_closed());
  }
  {
    RawSocket longkey(port);  // SET whose key length field exceeds 4 KiB
    longkey.send_bytes(hello());
    read_hello_reply(longkey);
    longkey.send_bytes(cat({le32(1 + 4 + 8), {1}, le32(100000), std::vector<uint8_t>(8, 0)}));
    EXPECT_TRUE(longkey.read_until_closed());
  }
  {
    RawSocket truncated(port);  // SET whose fields claim more bytes than the frame holds
    truncated.send_bytes(hello());
    read_hello_reply(truncated);
    truncated.send_bytes(cat({le32(1 + 4 + 1), {1}, le32(50), {'k'}}));
    EXPECT_TRUE(truncated.read_until_closed());
  }
  {
    RawSocket vanished(port);  // half a request, then gone
    vanished.send_bytes(hello());
    read_hello_reply(vanished);
    vanished.send_bytes(cat({le32(1000), {1, 2, 3}}));
  }
  {
    RawSocket waiting(port);  // blocked in WAIT for a key that never comes, then gone
    waiting.send_bytes(hello());
    read_hello_reply(waiting);
    auto body = cat({{5}, le32(1), le32(5), {'n', 'e', 'v', 'e', 'r'}, le32(60000), le32(0)});
    waiting.send_bytes(cat({le32(static_cast<uint32_t>(body.size())), body}));
  }
  RawSocket silent(port);  // connected, never says anything (kept open)
  // A real client is served throughout.
  TCPStore client("127.0.0.1", port, false, opts(kLong));
  client.set_string("still", "serving");
  EXPECT_EQ(server.get_string("still"), "serving");
  EXPECT_EQ(client.add("n", 4), 4);
  // Oversized messages are refused on the client side too, naming the limit.
  expect_error([&] { client.set_string(std::string(5000, 'k'), "v"); }, {"5000", "4096"});
}

TEST(TCPStore, WrongMagicOrVersionIsRejected) {
  TCPStore server("127.0.0.1", 0, true, opts(kLong));
  const int port = server.port();
  {
    RawSocket bad_magic(port);  // dropped without a reply
    bad_magic.send_bytes(hello(0x12345678u));
    std::vector<uint8_t> got;
    EXPECT_TRUE(bad_magic.read_until_closed(&got));
    EXPECT_TRUE(got.empty());
  }
  {
    RawSocket bad_version(port);  // told the server's version, then dropped
    bad_version.send_bytes(hello(tcp_store_protocol::kMagic, 99));
    std::vector<uint8_t> got;
    EXPECT_TRUE(bad_version.read_until_closed(&got));
    ASSERT_EQ(got.size(), 9u);
    EXPECT_EQ(std::vector<uint8_t>(got.begin() + 4, got.begin() + 8), le32(tcp_store_protocol::kVersion));
    EXPECT_EQ(got[8], 1);  // version mismatch
  }
  server.set_string("k", "still-serving");
  TCPStore ok("127.0.0.1", port, false, opts(kLong));
  EXPECT_EQ(ok.get_string("k"), "still-serving");

  // Client side: a "server" answering with another version or another magic.
  auto fake_server = [](std::vector<uint8_t> reply, int* port_out) {
    int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(lfd, 4), 0);
    socklen_t len = sizeof(a);
    ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    *port_out = ntohs(a.sin_port);
    return std::thread([lfd, reply] {
      pollfd pf{lfd, POLLIN, 0};
      if (::poll(&pf, 1, 10000) > 0) {
        int c = ::accept(lfd, nullptr, nullptr);
        uint8_t buf[8];
        size_t got = 0;
        while (got < 8) {
          ssize_t n = ::recv(c, buf + got, 8 - got, 0);
          if (n <= 0) break;
          got += static_cast<size_t>(n);
        }
        ::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
        ::close(c);
      }
      ::close(lfd);
    });
  };
  int fport = 0;
  std::thread t = fake_server(cat({le32(tcp_store_protocol::kMagic), le32(7), {1}}), &fport);
  expect_error([&] { TCPStore c("127.0.0.1", fport, false, opts(kLong)); },
               {"version mismatch", "127.0.0.1:" + std::to_string(fport), "version 7"});
  t.join();
  t = fake_server(cat({le32(0xdeadbeefu), le32(1), {0}}), &fport);
  expect_error([&] { TCPStore c("127.0.0.1", fport, false, opts(kLong)); },
               {"not a Tandem TCPStore", "127.0.0.1:" + std::to_string(fport)});
  t.join();
}

TEST(TCPStore, LargeValuesRoundTrip) {
  TCPStore server("127.0.0.1", 0, true, opts(kLong));
  TCPStore client("127.0.0.1", server.port(), false, opts(kLong));
  Bytes big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  client.set("big", big);
  EXPECT_EQ(server.get("big"), big);
  expect_error([&] { client.set("too-big", Bytes(tcp_store_protocol::kMaxValueBytes + 1)); },
               {"too-big", std::to_string(tcp_store_protocol::kMaxValueBytes)});
}

TEST(TCPStore, WaitForWorkers) {
  // Too few workers: the server names how many joined.
  TCPStoreOptions o = opts(kShort);
  o.num_workers = 2;
  expect_error([&] { TCPStore s("127.0.0.1", 0, true, o); }, {"1 of 2 workers"});
  // Enough workers: two clients start before the server and retry until it is up.
  ReservedPort reserved;
  const int port = reserved.port;
  reserved.release();
  auto worker = [port](int) {
    TCPStoreOptions w = opts(kLong);
    w.num_workers = 3;
    TCPStore c("127.0.0.1", port, false, w);
    c.set_string("joined", "1");
  };
  std::vector<test::Process> workers = test::fork_children(2, [&](int i) {
    worker(i);
    return 0;
  });
  TCPStoreOptions so = opts(kLong);
  so.num_workers = 3;
  TCPStore server("127.0.0.1", port, true, so);  // returns once all 3 joined
  EXPECT_EQ(server.add("__tandem_store/workers", 0), 3);
  ASSERT_TRUE(test::wait_all(workers, kChildLimit));
  for (const test::Process& w : workers) EXPECT_EQ(w.status(), 0);
}

TEST(TCPStore, VanishedServerFailsPromptlyNamingAddress) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  // Rank 0: serves until told to quit, then exits.
  test::Process rank0 = test::Process::fork([&] {
    TCPStore s("127.0.0.1", 0, true, opts(kLong));
    int port = s.port();
    if (::write(pipefd[1], &port, sizeof(port)) != sizeof(port)) return 4;
    s.wait({"quit"});
    return 0;
  });
  ASSERT_TRUE(rank0.started());
  ::close(pipefd[1]);
  int port = 0;
  ASSERT_EQ(::read(pipefd[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  ::close(pipefd[0]);
  TCPStore client("127.0.0.1", port, false, opts(kLong));
  client.set_string("quit", "1");
  ASSERT_TRUE(rank0.finish(kChildLimit).has_value());
  // The server is gone: a blocking get fails with the address instead of waiting 20 s.
  client.set_timeout(500ms);
  expect_error([&] { client.get("anything"); }, {"tcp://127.0.0.1:" + std::to_string(port)});
}

// ---------------- FileStore ----------------

TEST(FileStore, LastOfWorldSizeRemovesFile) {
  test::TempDir dir("store");
  std::string path = dir.file("store");
  {
    auto a = std::make_unique<FileStore>(path, 2, kLong);
    FileStore b(path, 2, kLong);
    a->set_string("k", "v");
    EXPECT_EQ(b.get_string("k"), "v");
    EXPECT_EQ(a->address(), "file://" + path);
    a.reset();
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(FileStore, UnopenablePathNamesIt) {
  expect_error([] { FileStore s("/nonexistent-dir-for-tandem/store"); }, {"/nonexistent-dir-for-tandem/store"});
}
