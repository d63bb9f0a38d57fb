// The TCP store's wire format and socket helpers, shared by its server (dist/store/tcp_store_server.cpp)
// and its client (dist/store/tcp_store.cpp); internal to dist/. The public protocol (framing, ops,
// limits, the tcp_store_protocol encoders and decoders the fuzz targets call) is in
// dist/store/tcp_store.h.
// Invariant: Reader never reads outside [p, p + n); every violation is a Malformed, which the
// server answers by dropping the client, never by trusting a length.
#pragma once

#include <netdb.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dist/store/tcp_store.h"

namespace tandem::dist::tcp_store_wire {

using namespace tcp_store_protocol;
using Clock = std::chrono::steady_clock;

enum Status : uint8_t { kOk = 0, kValue = 1, kTimeout = 2, kError = 3 };  // a reply's first byte
constexpr size_t kHelloBytes = 8, kHelloReplyBytes = 9;
// Largest request body: op + a key + a value with their length fields, or a
// WAIT/CHECK of many keys; anything longer is malformed.
constexpr size_t kMaxRequestBody = 1 + 4 + kMaxKeyBytes + 8 + kMaxValueBytes;
constexpr size_t kMaxResponseBody = 1 + kMaxValueBytes + 8;
constexpr auto kReplyGrace = std::chrono::seconds(2);
constexpr int64_t kMaxTimeoutMs = int64_t{1} << 40;  // ~35 years: "forever", without overflow

// Fields are little-endian; strings and values carry their length first (dist/store/tcp_store.h).

struct Writer {
  Bytes b;
  void u8(uint8_t v) { b.push_back(v); }
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  }
  void bytes(const Bytes& v) {
    u64(v.size());
    b.insert(b.end(), v.begin(), v.end());
  }
};

// Bounds-checked reader; any violation throws Malformed (the server drops the client).
struct Malformed {
  const char* what;
};
struct Reader {
  const uint8_t* p;
  size_t n;
  size_t pos = 0;
  uint64_t le(int k) {
    if (n - pos < static_cast<size_t>(k)) throw Malformed{"a field runs past the end of the message"};
    uint64_t v = 0;
    for (int i = 0; i < k; ++i) v |= uint64_t{p[pos + i]} << (8 * i);
    pos += k;
    return v;
  }
  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  std::string str() {
    uint32_t len = u32();
    if (len > kMaxKeyBytes) throw Malformed{"a key is longer than the limit"};
    if (n - pos < len) throw Malformed{"a key runs past the end of the message"};
    std::string s(reinterpret_cast<const char*>(p + pos), len);
    pos += len;
    return s;
  }
  Bytes bytes() {
    uint64_t len = u64();
    if (len > kMaxValueBytes) throw Malformed{"a value is longer than the limit"};
    if (n - pos < len) throw Malformed{"a value runs past the end of the message"};
    Bytes v(p + pos, p + pos + len);
    pos += len;
    return v;
  }
  std::vector<std::string> keys() {
    uint32_t count = u32();
    if (count > kMaxKeysPerRequest) throw Malformed{"more keys than the limit"};
    std::vector<std::string> ks;
    ks.reserve(std::min<size_t>(count, (n - pos) / 4));
    for (uint32_t i = 0; i < count; ++i) ks.push_back(str());
    return ks;
  }
  void end() const {
    if (pos != n) throw Malformed{"bytes left over after the last field"};
  }
};

std::string errno_str(int err);
// "host:port", with brackets around an IPv6 host.
std::string host_port(const std::string& host, int port);
// 'a', 'b', 'c': keys for messages.
std::string join_keys(const std::vector<std::string>& keys);
// A value holding a decimal integer (ADD's counters), or nullopt.
std::optional<int64_t> parse_int(const Bytes& v);
Bytes decimal(int64_t v);
void set_nodelay(int fd);
// Milliseconds left until the deadline, for poll(2): 0 when passed.
int ms_until(Clock::time_point deadline);

// Owns an addrinfo list.
struct AddrInfo {
  addrinfo* head = nullptr;
  AddrInfo() = default;
  AddrInfo(const AddrInfo&) = delete;
  AddrInfo& operator=(const AddrInfo&) = delete;
  ~AddrInfo() {
    if (head) ::freeaddrinfo(head);
  }
};
// getaddrinfo for a stream socket; returns its status (0: ok).
int resolve(const std::string& host, int port, bool passive, AddrInfo& out);
// "ip:port" of a connected socket's peer, or "an unknown address".
std::string peer_name(int fd);
// Whether a connected socket's peer is the socket itself: a client connecting on its own host to a
// port of the ephemeral range where nothing listens yet can be handed that very port as its source,
// and TCP's simultaneous open then connects it to itself, so that it reads its own requests back as
// replies. The client drops such a socket and tries again.
bool connected_to_itself(int fd);

}  // namespace tandem::dist::tcp_store_wire
