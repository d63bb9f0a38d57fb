// TCPStore rendezvous security (reliability brief R1): the server listens on
// the master address's interface only (loopback for 127.0.0.1/localhost)
// unless told otherwise; a shared token (TCPStoreOptions::token or
// TANDEM_STORE_TOKEN) is checked in the handshake and a client without it is
// refused with a clear message on both sides before it can read or write any
// key; handshakes that never finish are dropped; random garbage from raw
// sockets, before and after a valid handshake, never stops the server from
// serving real clients. Also the socket-free wire decoders the fuzz target
// drives: round trips, every truncation, and the limits.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "dist/raw_socket.h"
#include "core/error.h"
#include "dist/store/tcp_store.h"

using namespace tandem;
using namespace tandem::dist;
using namespace std::chrono_literals;
namespace proto = tandem::dist::tcp_store_protocol;
using tandem::test::error_of;
using tandem::test::raw_connect;
using tandem::test::RawSocket;

namespace {

constexpr Millis kLong = 20000ms;

TCPStoreOptions opts(Millis timeout = kLong) {
  TCPStoreOptions o;
  o.timeout = timeout;
  return o;
}

// Collects the server's refusal lines (called on the server thread).
struct Refusals {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& l) {
      std::lock_guard<std::mutex> lk(mu);
      lines.push_back(l);
    };
  }
  // Waits (at most 10 s) until `n` lines arrived; returns them.
  std::vector<std::string> wait_for(size_t n) {
    for (int i = 0; i < 1000; ++i) {
      {
        std::lock_guard<std::mutex> lk(mu);
        if (lines.size() >= n) return lines;
      }
      std::this_thread::sleep_for(10ms);
    }
    std::lock_guard<std::mutex> lk(mu);
    return lines;
  }
};

std::vector<uint8_t> le32(uint32_t v) { return {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)}; }
std::vector<uint8_t> cat(std::vector<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
std::vector<uint8_t> frame(const Bytes& body) { return cat({le32(static_cast<uint32_t>(body.size())), body}); }
Bytes set_request(const std::string& key, const std::string& value) {
  proto::Request q;
  q.op = proto::kSet;
  q.keys = {key};
  q.value = Bytes(value.begin(), value.end());
  return proto::encode_request(q);
}

// The first IPv4 address of this machine that is not loopback, or "".
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf))) found = buf;
  }
  ::freeifaddrs(list);
  return found;
}

// Sets an environment variable for the scope of one test.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) old = o;
    if (value)
      ::setenv(name.c_str(), value, 1);
    else
      ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

}  // namespace

// ---------------- where the server listens ----------------

TEST(StoreSecurity, LoopbackMasterAddressListensOnLoopbackOnly) {
  ScopedEnv no_bind("TANDEM_STORE_BIND_HOST", nullptr);
  const std::string ip = non_loopback_ipv4();
  if (ip.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to test from";
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    TCPStore server(host, 0, true, opts());
    const int fd = raw_connect(ip, server.port());
    const int err = errno;
    EXPECT_LT(fd, 0) << host << ": the store is reachable on " << ip << ":" << server.port();
    if (fd >= 0) ::close(fd);
    else EXPECT_EQ(err, ECONNREFUSED) << std::strerror(err);
    TCPStore client(host, server.port(), false, opts());  // loopback still works
    client.set_string("k", "v");
    EXPECT_EQ(server.get_string("k"), "v");
  }
  // Told otherwise (all interfaces): reachable on the other address too.
  TCPStoreOptions o = opts();
  o.bind_host = "0.0.0.0";
  TCPStore everywhere("127.0.0.1", 0, true, o);
  TCPStore remote(ip, everywhere.port(), false, opts());
  remote.set_string("from", "outside");
  EXPECT_EQ(everywhere.get_string("from"), "outside");
  {  // The same through the environment.
    ScopedEnv bind("TANDEM_STORE_BIND_HOST", "0.0.0.0");
    TCPStore env_server("127.0.0.1", 0, true, opts());
    TCPStore env_remote(ip, env_server.port(), false, opts());
    EXPECT_EQ(env_remote.add("n", 2), 2);
  }
}

// ---------------- the shared token ----------------

TEST(StoreSecurity, ClientWithoutTokenIsRefusedOnBothSides) {
  ScopedEnv no_token("TANDEM_STORE_TOKEN", nullptr);
  Refusals refusals;
  TCPStoreOptions so = opts();
  so.token = "s3cret-token";
  so.on_refused = refusals.sink();
  TCPStore server("127.0.0.1", 0, true, so);
  const int port = server.port();
  const std::string addr = "tcp://127.0.0.1:" + std::to_string(port);

  std::string msg = error_of([&] { TCPStore c("127.0.0.1", port, false, opts()); });
  EXPECT_HAS(msg, addr);
  EXPECT_HAS(msg, "refused this client");
  EXPECT_HAS(msg, "has none");
  EXPECT_HAS(msg, "TANDEM_STORE_TOKEN");
  auto lines = refusals.wait_for(1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_HAS(lines[0], addr);
  EXPECT_HAS(lines[0], "127.0.0.1:");
  EXPECT_HAS(lines[0], "presented no token");

  TCPStoreOptions wrong = opts();
  wrong.token = "s3cret-tokeN";
  msg = error_of([&] { TCPStore c("127.0.0.1", port, false, wrong); });
  EXPECT_HAS(msg, "does not match");
  lines = refusals.wait_for(2);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_HAS(lines[1], "does not match");

  TCPStoreOptions right = opts();
  right.token = "s3cret-token";
  TCPStore ok("127.0.0.1", port, false, right);
  ok.set_string("secret", "value");
  EXPECT_EQ(server.get_string("secret"), "value");
}

// A raw client that sends a tokenless hello and, in the same packet, requests
// that would write and read keys: refused, and none of them is executed.
TEST(StoreSecurity, RefusedClientCannotReadOrWriteKeys) {
  Refusals refusals;
  TCPStoreOptions so = opts();
  so.token = "t0ken";
  so.on_refused = refusals.sink();
  TCPStore server("127.0.0.1", 0, true, so);
  server.set_string("secret", "hidden");
  proto::Request get;
  get.op = proto::kGet;
  get.keys = {"secret"};
  for (const std::string& token :
       std::vector<std::string>{"", "t0keN", "t0ken-longer", std::string(proto::kMaxTokenBytes, 'x')}) {
    RawSocket raw(server.port());
    Bytes hello = proto::encode_hello(token);
    raw.send_some(cat({hello, frame(set_request("evil", "1")), frame(proto::encode_request(get))}));
    std::vector<uint8_t> got;
    EXPECT_TRUE(raw.read_until_closed(&got)) << "token '" << token << "'";
    ASSERT_EQ(got.size(), 9u) << "only the handshake reply may come back";
    EXPECT_EQ(got[8], proto::kHelloRefused);
  }
  EXPECT_FALSE(server.check({"evil"}));
  EXPECT_EQ(refusals.wait_for(4).size(), 4u);
  {  // A token over the limit: dropped without a reply.
    RawSocket raw(server.port());
    raw.send_some(cat({le32(proto::kMagic), le32(proto::kVersion), le32(proto::kMaxTokenBytes + 1)}));
    std::vector<uint8_t> got;
    EXPECT_TRUE(raw.read_until_closed(&got));
    EXPECT_TRUE(got.empty());
    auto lines = refusals.wait_for(5);
    ASSERT_EQ(lines.size(), 5u);
    EXPECT_HAS(lines[4], "exceeds the limit");
  }
  {  // A version-1 client (8-byte hello, no token) learns the version and is closed.
    RawSocket raw(server.port());
    raw.send_some(cat({le32(proto::kMagic), le32(1), frame(set_request("evil", "1"))}));
    std::vector<uint8_t> got;
    EXPECT_TRUE(raw.read_until_closed(&got));
    ASSERT_EQ(got.size(), 9u);
    EXPECT_EQ(got[8], proto::kHelloVersionMismatch);
  }
  EXPECT_FALSE(server.check({"evil"}));
  EXPECT_EQ(server.get_string("secret"), "hidden");
}

TEST(StoreSecurity, TokenFromEnvironment) {
  ScopedEnv token("TANDEM_STORE_TOKEN", "from-env");
  TCPStore server("127.0.0.1", 0, true, opts());
  TCPStore client("127.0.0.1", server.port(), false, opts());
  EXPECT_EQ(client.add("n", 5), 5);
  TCPStoreOptions none = opts();
  none.token = "";
  EXPECT_HAS(error_of([&] { TCPStore c("127.0.0.1", server.port(), false, none); }), "refused");
  // Over the limit: refused before connecting.
  TCPStoreOptions huge = opts();
  huge.token = std::string(proto::kMaxTokenBytes + 1, 't');
  EXPECT_HAS(error_of([&] { TCPStore c("127.0.0.1", server.port(), false, huge); }), "more than the limit");
}

// Without a server token, clients with or without one are served (the token is opt-in).
TEST(StoreSecurity, NoServerTokenServesEveryone) {
  ScopedEnv no_token("TANDEM_STORE_TOKEN", nullptr);
  TCPStore server("127.0.0.1", 0, true, opts());
  TCPStoreOptions with = opts();
  with.token = "anything";
  TCPStore a("127.0.0.1", server.port(), false, with);
  TCPStore b("127.0.0.1", server.port(), false, opts());
  a.set_string("k", "1");
  EXPECT_EQ(b.get_string("k"), "1");
}

TEST(StoreSecurity, UnfinishedHandshakeIsDropped) {
  Refusals refusals;
  TCPStoreOptions so = opts();
  so.hello_timeout = 300ms;
  so.on_refused = refusals.sink();
  TCPStore server("127.0.0.1", 0, true, so);
  RawSocket silent(server.port());
  RawSocket partial(server.port());
  partial.send_some({0x53, 0x4E});  // half a magic
  EXPECT_TRUE(silent.read_until_closed());
  EXPECT_TRUE(partial.read_until_closed());
  auto lines = refusals.wait_for(2);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_HAS(lines[0], "no complete handshake within 300 ms");
  // A client that finishes its handshake is not subject to that deadline.
  TCPStore client("127.0.0.1", server.port(), false, opts());
  std::this_thread::sleep_for(500ms);
  client.set_string("late", "ok");
  EXPECT_EQ(server.get_string("late"), "ok");
}

// ---------------- garbage ----------------

// Random bytes from many raw sockets, before and after a valid handshake,
// interleaved with a real client's requests: the server drops each bad
// connection and answers every real request correctly.
TEST(StoreSecurity, RandomGarbageNeverStopsServer) {
  ScopedEnv no_token("TANDEM_STORE_TOKEN", nullptr);
  Refusals refusals;
  TCPStoreOptions so = opts();
  so.on_refused = refusals.sink();
  so.hello_timeout = 200ms;  // junk shorter than a handshake is dropped promptly
  TCPStore server("127.0.0.1", 0, true, so);
  TCPStore client("127.0.0.1", server.port(), false, opts());
  std::mt19937 rng(12345);
  for (int i = 0; i < 200; ++i) {
    {
      RawSocket raw(server.port());
      std::vector<uint8_t> junk(1 + rng() % 300);
      for (auto& b : junk) b = static_cast<uint8_t>(rng());
      if (i % 2) {  // a valid handshake first, then a frame of junk with a plausible length
        Bytes body(1 + rng() % 64);
        for (auto& b : body) b = static_cast<uint8_t>(rng());
        if (i % 4 == 1) body[0] = static_cast<uint8_t>(1 + rng() % 6);  // a real op code, junk after it
        junk = cat({proto::encode_hello(""), frame(body), junk});
      }
      raw.send_some(junk);
      if (i % 3 == 0) raw.read_until_closed();  // sometimes wait for the drop, sometimes just vanish
    }
    const std::string key = "real/" + std::to_string(i);
    client.set_string(key, std::to_string(i * 7));
    ASSERT_EQ(client.get_string(key), std::to_string(i * 7));
  }
  EXPECT_EQ(client.add("count", 200), 200);
  // Junk frames after a valid handshake may even be valid requests; everything
  // the real client wrote is intact.
  for (int i = 0; i < 200; i += 37) EXPECT_EQ(server.get_string("real/" + std::to_string(i)), std::to_string(i * 7));
}

// ---------------- the decoders, without sockets ----------------

TEST(StoreWire, RequestsRoundTripAndEveryTruncationIsAnError) {
  std::vector<proto::Request> qs(6);
  qs[0].op = proto::kSet, qs[0].keys = {"key"}, qs[0].value = {1, 2, 3, 0, 255};
  qs[1].op = proto::kGet, qs[1].keys = {"g"}, qs[1].timeout_ms = 1234;
  qs[2].op = proto::kAdd, qs[2].keys = {"counter"}, qs[2].delta = -42;
  qs[3].op = proto::kCheck, qs[3].keys = {"a", "", "ccc"};
  qs[4].op = proto::kWait, qs[4].keys = {"x", "y"}, qs[4].timeout_ms = ~uint64_t(0);
  qs[5].op = proto::kDelete, qs[5].keys = {"gone"};
  for (const auto& q : qs) {
    const Bytes b = proto::encode_request(q);
    const proto::Request d = proto::decode_request(b.data(), b.size());
    EXPECT_EQ(d.op, q.op);
    EXPECT_EQ(d.keys, q.keys);
    EXPECT_EQ(d.value, q.value);
    EXPECT_EQ(d.delta, q.delta);
    EXPECT_EQ(d.timeout_ms, q.timeout_ms);
    for (size_t len = 0; len < b.size(); ++len) {
      // An exact-size heap copy, so a read past `len` is caught by AddressSanitizer.
      std::unique_ptr<uint8_t[]> cut(new uint8_t[len + 1]);
      std::memcpy(cut.get(), b.data(), len);
      EXPECT_HAS(error_of([&] { proto::decode_request(cut.get(), len); }), "malformed TCPStore request");
    }
    Bytes longer = b;
    longer.push_back(0);
    EXPECT_HAS(error_of([&] { proto::decode_request(longer.data(), longer.size()); }), "left over");
  }
  const Bytes unknown = {99};
  EXPECT_HAS(error_of([&] { proto::decode_request(unknown.data(), unknown.size()); }), "unknown op code 99");
  // Lengths over the limits are refused before anything is allocated.
  const Bytes long_key = cat({{proto::kSet}, le32(proto::kMaxKeyBytes + 1)});
  EXPECT_HAS(error_of([&] { proto::decode_request(long_key.data(), long_key.size()); }), "key is longer");
  const Bytes many = cat({{proto::kCheck}, le32(static_cast<uint32_t>(proto::kMaxKeysPerRequest + 1))});
  EXPECT_HAS(error_of([&] { proto::decode_request(many.data(), many.size()); }), "more keys");
  const Bytes big_value = cat({{proto::kSet}, le32(1), {'k'}, le32(0xFFFFFFFFu), le32(0xFFFFFFFFu)});
  EXPECT_HAS(error_of([&] { proto::decode_request(big_value.data(), big_value.size()); }), "value is longer");
}

TEST(StoreWire, HelloDecoding) {
  size_t used = 0;
  const Bytes h = proto::encode_hello("tok");
  for (size_t len = 0; len < h.size(); ++len) EXPECT_FALSE(proto::decode_hello(h.data(), len, &used)) << len;
  auto d = proto::decode_hello(h.data(), h.size(), &used);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->token, "tok");
  EXPECT_EQ(d->version, proto::kVersion);
  EXPECT_EQ(used, h.size());
  const Bytes bad = cat({le32(0x12345678u), le32(proto::kVersion)});
  EXPECT_HAS(error_of([&] { proto::decode_hello(bad.data(), bad.size(), &used); }), "wrong magic 0x12345678");
  const Bytes old = cat({le32(proto::kMagic), le32(1)});
  d = proto::decode_hello(old.data(), old.size(), &used);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->version, 1u);
  EXPECT_EQ(used, 8u);
}

TEST(StoreWire, ConstantTimeEqual) {
  EXPECT_TRUE(proto::constant_time_equal("", ""));
  EXPECT_TRUE(proto::constant_time_equal("abc", "abc"));
  EXPECT_FALSE(proto::constant_time_equal("abc", "abd"));
  EXPECT_FALSE(proto::constant_time_equal("abc", "ab"));
  EXPECT_FALSE(proto::constant_time_equal("", "a"));
  EXPECT_FALSE(proto::constant_time_equal(std::string("a\0", 2), "a"));
}
