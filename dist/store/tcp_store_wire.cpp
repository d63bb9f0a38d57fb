// The TCP store's wire format (dist/store/tcp_store_wire.h, dist/store/tcp_store.h): the handshake and request
// encoders and decoders, socket-free so that tests and fuzz/fuzz_store_wire.cpp feed them bytes
// directly, and the socket helpers the server and the client share.
#include "dist/store/tcp_store_wire.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tandem::dist {

namespace tcp_store_wire {

std::string errno_str(int err) { return std::strerror(err); }

std::string host_port(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  return s;
}
std::optional<int64_t> parse_int(const Bytes& v) {
  int64_t x = 0;
  const char* b = reinterpret_cast<const char*>(v.data());
  auto [ptr, ec] = std::from_chars(b, b + v.size(), x);
  if (v.empty() || ec != std::errc() || ptr != b + v.size()) return std::nullopt;
  return x;
}

Bytes decimal(int64_t v) {
  std::string s = std::to_string(v);
  return Bytes(s.begin(), s.end());
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // best effort (fails on non-TCP)
}

int ms_until(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

int resolve(const std::string& host, int port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  std::string service = std::to_string(port);
  return ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out.head);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return host_port(host, std::atoi(serv));
}

bool connected_to_itself(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof(local), pl = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 || local.ss_family != peer.ss_family) {
    return false;
  }
  if (local.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(local);
    const auto& b = reinterpret_cast<const sockaddr_in&>(peer);
    return a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
  }
  if (local.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(local);
    const auto& b = reinterpret_cast<const sockaddr_in6&>(peer);
    return a.sin6_port == b.sin6_port && std::memcmp(&a.sin6_addr, &b.sin6_addr, sizeof(a.sin6_addr)) == 0;
  }
  return false;
}

}  // namespace tcp_store_wire

using namespace tcp_store_wire;

namespace tcp_store_protocol {

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Runs over the longer length whatever the contents; only the lengths leak.
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0u;
    const unsigned y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0u;
    diff |= x ^ y;
  }
  return diff == 0;
}

std::optional<Hello> decode_hello(const uint8_t* data, size_t avail, size_t* consumed) {
  if (avail < kHelloBytes) return std::nullopt;
  Reader r{data, avail};
  const uint32_t magic = r.u32();
  Hello h;
  h.version = r.u32();
  TANDEM_CHECK(magic == kMagic, "TCPStore handshake: wrong magic 0x", std::hex, magic, " (expected 0x", kMagic,
               std::dec, "); not a Tandem TCPStore client");
  if (h.version != kVersion) {  // an older or newer client: the rest is not ours to parse
    *consumed = kHelloBytes;
    return h;
  }
  if (avail < kHelloBytes + 4) return std::nullopt;
  const uint32_t len = r.u32();
  TANDEM_CHECK(len <= kMaxTokenBytes, "TCPStore handshake: token of ", len, " bytes exceeds the limit of ",
               kMaxTokenBytes, " bytes");
  if (avail - (kHelloBytes + 4) < len) return std::nullopt;
  h.token.assign(reinterpret_cast<const char*>(data + kHelloBytes + 4), len);
  *consumed = kHelloBytes + 4 + len;
  return h;
}

Bytes encode_hello(const std::string& token) {
  Writer w;
  w.u32(kMagic);
  w.u32(kVersion);
  w.str(token);
  return std::move(w.b);
}

Request decode_request(const uint8_t* body, size_t n) {
  Request q;
  try {
    Reader r{body, n};
    const uint8_t op = r.u8();
    switch (op) {
      case kSet:
        q.keys.push_back(r.str());
        q.value = r.bytes();
        break;
      case kGet:
        q.keys.push_back(r.str());
        q.timeout_ms = r.u64();
        break;
      case kWait:
        q.keys = r.keys();
        q.timeout_ms = r.u64();
        break;
      case kAdd:
        q.keys.push_back(r.str());
        q.delta = static_cast<int64_t>(r.u64());
        break;
      case kCheck:
        q.keys = r.keys();
        break;
      case kDelete:
        q.keys.push_back(r.str());
        break;
      default:
        TANDEM_FAIL("malformed TCPStore request: unknown op code ", int(op), ", expected 1..6");
    }
    q.op = static_cast<Op>(op);
    r.end();
  } catch (const Malformed& m) {
    TANDEM_FAIL("malformed TCPStore request of ", n, " bytes: ", m.what);
  }
  return q;
}

Bytes encode_request(const Request& q) {
  Writer w;
  w.u8(q.op);
  switch (q.op) {
    case kSet:
      w.b.reserve(1 + 4 + q.keys.at(0).size() + 8 + q.value.size());
      w.str(q.keys.at(0));
      w.bytes(q.value);
      break;
    case kGet:
      w.str(q.keys.at(0));
      w.u64(q.timeout_ms);
      break;
    case kWait:
    case kCheck:
      w.u32(static_cast<uint32_t>(q.keys.size()));
      for (const auto& k : q.keys) w.str(k);
      if (q.op == kWait) w.u64(q.timeout_ms);
      break;
    case kAdd:
      w.str(q.keys.at(0));
      w.u64(static_cast<uint64_t>(q.delta));
      break;
    case kDelete:
      w.str(q.keys.at(0));
      break;
  }
  return std::move(w.b);
}

}  // namespace tcp_store_protocol

}  // namespace tandem::dist
