// TCPStore: the server's poll loop, the wire encoding and the client. See
// tcp_store.h for the protocol and guarantees. The handshake and request
// decoders are socket-free functions (tcp_store_protocol::decode_*) so that
// tests and fuzz/fuzz_store_wire.cpp can feed them bytes directly. The server thread owns the key
// map and every accepted socket; nothing else touches them. The client side
// uses non-blocking sockets and poll(2) so that every wait has a deadline.
#include "dist/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <list>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace tandem::dist {

using namespace tcp_store_protocol;
using Clock = std::chrono::steady_clock;

namespace {

enum Status : uint8_t { kOk = 0, kValue = 1, kTimeout = 2, kError = 3 };
constexpr size_t kHelloBytes = 8, kHelloReplyBytes = 9;
// Largest request body: op + a key + a value with their length fields, or a
// WAIT/CHECK of many keys; anything longer is malformed.
constexpr size_t kMaxRequestBody = 1 + 4 + kMaxKeyBytes + 8 + kMaxValueBytes;
constexpr size_t kMaxResponseBody = 1 + kMaxValueBytes + 8;
constexpr auto kReplyGrace = std::chrono::seconds(2);
constexpr int64_t kMaxTimeoutMs = int64_t{1} << 40;  // ~35 years: "forever", without overflow

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

// ---- encoding ----

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

// Owns an addrinfo list.
struct AddrInfo {
  addrinfo* head = nullptr;
  ~AddrInfo() {
    if (head) ::freeaddrinfo(head);
  }
};

int resolve(const std::string& host, int port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  std::string service = std::to_string(port);
  return ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out.head);
}

// "ip:port" of a connected socket's peer, or "an unknown address".
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

}  // namespace

// ======================= wire decoding (shared with the fuzz targets) =======================

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

// ======================= server =======================

class TCPStoreServer {
 public:
  using RefusedFn = std::function<void(const std::string&)>;
  TCPStoreServer(const std::string& host, int port, std::string token, Millis hello_timeout, RefusedFn on_refused);
  ~TCPStoreServer();
  int port() const { return port_; }

 private:
  struct Pending {
    uint8_t op;  // kGet or kWait
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  struct Conn {
    int fd = -1;
    Bytes in;
    size_t in_pos = 0;
    Bytes out;
    size_t out_pos = 0;
    bool hello_done = false;
    Clock::time_point hello_deadline;
    std::string peer;  // "ip:port", for refusal messages
    bool closing = false;  // drop once `out` is flushed
    bool dead = false;
    std::optional<Pending> pending;
  };

  void loop();
  void accept_all();
  void read_from(Conn& c);
  void write_to(Conn& c);
  void process(Conn& c);        // handles buffered input while the connection may take requests
  void handle(Conn& c, tcp_store_protocol::Request& q);
  void handshake(Conn& c);      // decodes the hello once it has fully arrived
  void refuse(Conn& c, const std::string& why);
  bool try_answer(Conn& c);     // answers c.pending if its keys exist; true when answered
  void answer_timeout(Conn& c);
  void wake_waiters();
  void reply(Conn& c, uint8_t status, const Bytes& payload = {});
  void drop(Conn& c) { c.dead = true; }

  std::string addr_;
  std::string token_;
  Millis hello_timeout_;
  RefusedFn on_refused_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::list<Conn> conns_;
  std::unordered_map<std::string, Bytes> data_;
  bool mutated_ = false;
  Clock::time_point accept_pause_until_{};
};

TCPStoreServer::TCPStoreServer(const std::string& host, int port, std::string token, Millis hello_timeout,
                               RefusedFn on_refused)
    : addr_("tcp://" + host_port(host, port)),
      token_(std::move(token)),
      hello_timeout_(hello_timeout),
      on_refused_(std::move(on_refused)) {
  AddrInfo ai;
  int rc = resolve(host, port, /*passive=*/true, ai);
  TANDEM_CHECK(rc == 0, "TCPStore: cannot resolve the server address ", addr_, ": ", ::gai_strerror(rc),
               " (expected MASTER_ADDR to be this host's name or IP address)");
  std::string err;
  for (addrinfo* a = ai.head; a && listen_fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      err = "socket(): " + errno_str(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // rebinding over TIME_WAIT only
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      int e = errno;
      ::close(fd);
      if (e == EADDRINUSE)
        TANDEM_FAIL("TCPStore: cannot listen on ", addr_, ": address already in use (another job or an "
                    "earlier run holds port ", port, "); choose another MASTER_PORT / --master-port");
      err = "bind(): " + errno_str(e);
      continue;
    }
    if (::listen(fd, 1024) != 0) {
      int e = errno;
      ::close(fd);
      if (e == EADDRINUSE)
        TANDEM_FAIL("TCPStore: cannot listen on ", addr_, ": address already in use (another job or an "
                    "earlier run holds port ", port, "); choose another MASTER_PORT / --master-port");
      err = "listen(): " + errno_str(e);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      err = "getsockname(): " + errno_str(errno);
      ::close(fd);
      continue;
    }
    port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    listen_fd_ = fd;
  }
  TANDEM_CHECK(listen_fd_ >= 0, "TCPStore: cannot listen on ", addr_, ": ", err);
  addr_ = "tcp://" + host_port(host, port_);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    int e = errno;
    ::close(listen_fd_);
    TANDEM_FAIL("TCPStore server ", addr_, ": pipe2() failed: ", errno_str(e));
  }
  thread_ = std::thread([this] { loop(); });
}

TCPStoreServer::~TCPStoreServer() {
  char b = 1;
  while (::write(wake_[1], &b, 1) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
  for (auto& c : conns_) ::close(c.fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void TCPStoreServer::loop() {
  std::vector<pollfd> fds;
  std::vector<Conn*> order;
  for (;;) {
    fds.clear();
    order.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    auto now = Clock::now();
    bool accepting = static_cast<int>(conns_.size()) < kMaxClients && now >= accept_pause_until_;
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    Clock::time_point next = Clock::time_point::max();
    if (!accepting && now < accept_pause_until_) next = accept_pause_until_;
    for (auto& c : conns_) {
      short ev = POLLRDHUP;  // our clients never half-close: a FIN means the client is gone
      if (c.out_pos < c.out.size())
        ev |= POLLOUT;
      else if (!c.closing && !c.pending)
        ev |= POLLIN;
      if (c.pending) next = std::min(next, c.pending->deadline);
      if (!c.hello_done) next = std::min(next, c.hello_deadline);
      fds.push_back({c.fd, ev, 0});
      order.push_back(&c);
    }
    int wait_ms = next == Clock::time_point::max() ? -1 : ms_until(next);
    int n = ::poll(fds.data(), fds.size(), wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // unrecoverable: close everything below so clients fail fast instead of hanging
    }
    if (fds[0].revents) return;  // destructor asked us to stop
    if (fds[1].revents & POLLIN) accept_all();
    for (size_t i = 0; i < order.size(); ++i) {
      Conn& c = *order[i];
      short re = fds[i + 2].revents;
      if (!re || c.dead) continue;
      if (re & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) {
        drop(c);  // vanished (even mid-request or while blocked in GET/WAIT): nobody to answer
        continue;
      }
      if (re & POLLOUT) write_to(c);
      if (!c.dead && (re & POLLIN)) read_from(c);
      if (!c.dead) process(c);
    }
    // Mutations may have satisfied waiters; deadlines may have passed.
    if (mutated_) wake_waiters();
    now = Clock::now();
    for (auto& c : conns_) {
      if (!c.dead && c.pending && c.pending->deadline <= now) answer_timeout(c);
      if (!c.dead && !c.hello_done && c.hello_deadline <= now) {
        refuse(c, "no complete handshake within " + std::to_string(hello_timeout_.count()) + " ms");
        drop(c);
      }
    }
    for (auto& c : conns_)
      if (!c.dead && c.closing && c.out_pos == c.out.size()) drop(c);
    conns_.remove_if([](Conn& c) {
      if (c.dead) ::close(c.fd);
      return c.dead;
    });
  }
  for (auto& c : conns_) ::close(c.fd);
  conns_.clear();
  ::close(listen_fd_);
  listen_fd_ = -1;
}

void TCPStoreServer::accept_all() {
  while (static_cast<int>(conns_.size()) < kMaxClients) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)  // EMFILE and the like: retry a little later
        accept_pause_until_ = Clock::now() + std::chrono::milliseconds(50);
      return;
    }
    set_nodelay(fd);
    Conn& c = conns_.emplace_back();
    c.fd = fd;
    c.hello_deadline = Clock::now() + hello_timeout_;
    c.peer = peer_name(fd);
  }
}

void TCPStoreServer::read_from(Conn& c) {
  uint8_t buf[65536];
  for (;;) {
    // Never buffer more than one maximal frame beyond what is unparsed.
    if (c.in.size() - c.in_pos > kMaxRequestBody + 4) return;
    ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.insert(c.in.end(), buf, buf + n);
      if (n < static_cast<ssize_t>(sizeof(buf))) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    drop(c);  // orderly close (a client that vanished) or an error
    return;
  }
}

void TCPStoreServer::write_to(Conn& c) {
  while (c.out_pos < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    drop(c);
    return;
  }
  c.out.clear();
  c.out_pos = 0;
}

void TCPStoreServer::reply(Conn& c, uint8_t status, const Bytes& payload) {
  Writer w;
  w.b.reserve(5 + payload.size());
  w.u32(static_cast<uint32_t>(1 + payload.size()));
  w.u8(status);
  w.b.insert(w.b.end(), payload.begin(), payload.end());
  if (c.out.empty()) {
    c.out = std::move(w.b);
    c.out_pos = 0;
  } else {
    c.out.insert(c.out.end(), w.b.begin(), w.b.end());
  }
  write_to(c);  // most replies go out at once; the rest wait for POLLOUT
}

void TCPStoreServer::process(Conn& c) {
  // One request at a time: a reply must be flushed (and a blocked GET/WAIT
  // answered) before the next request is read, so a client cannot make the
  // server buffer unbounded replies.
  while (!c.dead && !c.closing && !c.pending && c.out_pos == c.out.size()) {
    size_t avail = c.in.size() - c.in_pos;
    const uint8_t* p = c.in.data() + c.in_pos;
    if (!c.hello_done) {
      size_t before = c.in_pos;
      handshake(c);
      if (c.in_pos == before) break;  // needs more bytes (or the client was dropped)
      continue;
    }
    if (avail < 4) break;
    uint32_t len = static_cast<uint32_t>(Reader{p, 4}.u32());
    if (len == 0 || len > kMaxRequestBody) {
      drop(c);
      break;
    }
    if (avail - 4 < len) break;
    c.in_pos += 4 + len;
    try {
      Request q = decode_request(p + 4, len);
      handle(c, q);
    } catch (const std::exception&) {  // malformed, or e.g. bad_alloc: lose this client, keep serving
      drop(c);
    }
  }
  // Compact the input buffer.
  if (c.in_pos == c.in.size()) {
    c.in.clear();
    c.in_pos = 0;
  } else if (c.in_pos > (1u << 16) && c.in_pos * 2 > c.in.size()) {
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(c.in_pos));
    c.in_pos = 0;
  }
}

void TCPStoreServer::handshake(Conn& c) {
  size_t used = 0;
  std::optional<Hello> h;
  try {
    h = decode_hello(c.in.data() + c.in_pos, c.in.size() - c.in_pos, &used);
  } catch (const Error& e) {
    refuse(c, e.what());
    drop(c);  // not our protocol, or an absurd token: say nothing
    return;
  }
  if (!h) return;
  c.in_pos += used;
  c.hello_done = true;
  uint8_t status = kHelloAccepted;
  if (h->version != kVersion) {
    status = kHelloVersionMismatch;
  } else if (!token_.empty() && !constant_time_equal(h->token, token_)) {
    status = kHelloRefused;
    refuse(c, h->token.empty() ? "it presented no token and this server requires TANDEM_STORE_TOKEN"
                               : "its token does not match this server's TANDEM_STORE_TOKEN");
  }
  Writer w;
  w.u32(kMagic);
  w.u32(kVersion);
  w.u8(status);
  c.out = std::move(w.b);
  c.out_pos = 0;
  if (status != kHelloAccepted) c.closing = true;  // nothing more is read from it
  write_to(c);
}

void TCPStoreServer::refuse(Conn& c, const std::string& why) {
  std::string line = "TCPStore server " + addr_ + ": refused the client at " + c.peer + ": " + why;
  if (on_refused_) {
    on_refused_(line);
    return;
  }
  // Rate-limited: a port scanner or a misconfigured job must not flood the log.
  static std::atomic<int64_t> last_ms{INT64_MIN / 2};
  static std::atomic<int64_t> suppressed{0};
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  if (now_ms - last_ms.load() < 1000) {
    ++suppressed;
    return;
  }
  last_ms = now_ms;
  const int64_t more = suppressed.exchange(0);
  if (more > 0) line += " (" + std::to_string(more) + " more refusals not shown)";
  spdlog::warn("{}", line);
}

void TCPStoreServer::handle(Conn& c, Request& q) {
  switch (q.op) {
    case kSet: {
      data_[q.keys[0]] = std::move(q.value);
      mutated_ = true;
      reply(c, kOk);
      return;
    }
    case kGet:
    case kWait: {
      int64_t timeout_ms = static_cast<int64_t>(std::min<uint64_t>(q.timeout_ms, kMaxTimeoutMs));
      c.pending = Pending{q.op, std::move(q.keys), Clock::now() + std::chrono::milliseconds(timeout_ms)};
      if (!try_answer(c) && timeout_ms == 0) answer_timeout(c);
      return;
    }
    case kAdd: {
      const std::string& key = q.keys[0];
      int64_t v = q.delta;
      if (auto it = data_.find(key); it != data_.end()) {
        std::optional<int64_t> old = parse_int(it->second);
        if (!old) {
          std::string msg = "add() on key '" + key + "' whose value is not a decimal integer";
          reply(c, kError, Bytes(msg.begin(), msg.end()));
          return;
        }
        v = static_cast<int64_t>(static_cast<uint64_t>(*old) + static_cast<uint64_t>(q.delta));
      }
      data_[key] = decimal(v);
      mutated_ = true;
      Writer w;
      w.u64(static_cast<uint64_t>(v));
      reply(c, kValue, w.b);
      return;
    }
    case kCheck: {
      bool all = std::all_of(q.keys.begin(), q.keys.end(), [&](const auto& k) { return data_.count(k) > 0; });
      reply(c, kValue, Bytes{static_cast<uint8_t>(all)});
      return;
    }
    case kDelete: {
      bool existed = data_.erase(q.keys[0]) > 0;
      reply(c, kValue, Bytes{static_cast<uint8_t>(existed)});
      return;
    }
  }
}

bool TCPStoreServer::try_answer(Conn& c) {
  const Pending& p = *c.pending;
  for (const auto& k : p.keys)
    if (!data_.count(k)) return false;
  if (p.op == kGet) {
    Bytes value = data_.at(p.keys[0]);
    c.pending.reset();
    reply(c, kValue, value);
  } else {
    c.pending.reset();
    reply(c, kOk);
  }
  return true;
}

void TCPStoreServer::answer_timeout(Conn& c) {
  Writer w;
  std::vector<std::string> missing;
  for (const auto& k : c.pending->keys)
    if (!data_.count(k)) missing.push_back(k);
  w.u32(static_cast<uint32_t>(missing.size()));
  for (const auto& k : missing) w.str(k);
  c.pending.reset();
  reply(c, kTimeout, w.b);
}

void TCPStoreServer::wake_waiters() {
  // A woken client's next buffered request may mutate again: repeat until quiet.
  while (mutated_) {
    mutated_ = false;
    for (auto& c : conns_) {
      if (c.dead || !c.pending) continue;
      if (try_answer(c)) process(c);
    }
  }
}

// ======================= client =======================

namespace {

// Sends/receives exactly len bytes before the deadline; returns "" or what went wrong.
std::string send_all(int fd, const uint8_t* p, size_t len, Clock::time_point deadline) {
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      int left = ms_until(deadline);
      if (left == 0) return "timed out sending";
      int rc = ::poll(&pf, 1, left);
      if (rc < 0 && errno != EINTR) return "poll(): " + errno_str(errno);
      continue;
    }
    return "send(): " + errno_str(errno);
  }
  return "";
}

std::string recv_all(int fd, uint8_t* p, size_t len, Clock::time_point deadline) {
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return "the server closed the connection";
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pf{fd, POLLIN, 0};
      int left = ms_until(deadline);
      if (left == 0) return "timed out waiting for the server's reply";
      int rc = ::poll(&pf, 1, left);
      if (rc < 0 && errno != EINTR) return "poll(): " + errno_str(errno);
      continue;
    }
    return "recv(): " + errno_str(errno);
  }
  return "";
}

// Connects one socket to `a` before the deadline; returns the fd, or -1 with `err` set.
int connect_one(const addrinfo* a, Clock::time_point deadline, std::string& err) {
  int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    err = "socket(): " + errno_str(errno);
    return -1;
  }
  if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      err = errno_str(errno);
      ::close(fd);
      return -1;
    }
    pollfd pf{fd, POLLOUT, 0};
    int rc;
    do rc = ::poll(&pf, 1, ms_until(deadline));
    while (rc < 0 && errno == EINTR);
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    if (rc <= 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
      err = rc == 0 ? "connect timed out" : errno_str(soerr ? soerr : errno);
      ::close(fd);
      return -1;
    }
  }
  set_nodelay(fd);
  return fd;
}

}  // namespace

TCPStore::TCPStore(std::string host, int port, bool is_server, TCPStoreOptions options)
    : host_(std::move(host)), port_(port) {
  timeout_ = options.timeout;
  TANDEM_CHECK(!host_.empty(), "TCPStore: empty host; expected MASTER_ADDR (127.0.0.1 for one node)");
  TANDEM_CHECK(port >= 0 && port <= 65535, "TCPStore: port ", port, " out of range; expected 0..65535");
  TANDEM_CHECK(is_server || port > 0, "TCPStore: a client needs the server's port, got ", port,
               " (port 0 only means 'pick a free port' for the server)");
  TANDEM_CHECK(!options.num_workers || *options.num_workers >= 1, "TCPStore ", address(),
               ": num_workers must be >= 1, got ", options.num_workers.value_or(0));
  const char* env_token = std::getenv("TANDEM_STORE_TOKEN");
  token_ = options.token ? *options.token : std::string(env_token ? env_token : "");
  TANDEM_CHECK(token_.size() <= kMaxTokenBytes, "TCPStore ", address(), ": the store token (TANDEM_STORE_TOKEN) has ",
               token_.size(), " bytes, more than the limit of ", kMaxTokenBytes);
  if (is_server) {
    const char* env_bind = std::getenv("TANDEM_STORE_BIND_HOST");
    std::string bind = options.bind_host ? *options.bind_host : env_bind && *env_bind ? env_bind : host_;
    server_ = std::make_unique<TCPStoreServer>(bind, port, token_, options.hello_timeout, options.on_refused);
    port_ = server_->port();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    connect_locked(timeout_);
  }
  try {
    join_workers(options);
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    close_locked();  // the destructor does not run for a throwing constructor
    throw;
  }
}

void TCPStore::join_workers(const TCPStoreOptions& options) {
  if (options.num_workers) {
    const std::string count_key = "__tandem_store/workers", ready_key = "__tandem_store/workers_ready";
    if (add(count_key, 1) == *options.num_workers) set_string(ready_key, "1");
    if (server_ && options.wait_for_workers) {
      try {
        wait({ready_key}, timeout_);
      } catch (const Error&) {
        int64_t joined = add(count_key, 0);
        TANDEM_FAIL("TCPStore ", address(), ": only ", joined, " of ", *options.num_workers,
                    " workers joined within ", timeout_.count(),
                    " ms; did every rank start with the same MASTER_ADDR/MASTER_PORT and world size?");
      }
    }
  }
}

TCPStore::~TCPStore() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    close_locked();
  }
  server_.reset();  // wakes and joins the server thread
}

std::string TCPStore::address() const { return "tcp://" + host_port(host_, port_); }

void TCPStore::close_locked() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TCPStore::connect_locked(Millis timeout) {
  // A server bound to the wildcard address is reached through loopback.
  std::string target = host_;
  if (target == "0.0.0.0") target = "127.0.0.1";
  if (target == "::") target = "::1";
  const auto start = Clock::now(), deadline = start + timeout;
  auto backoff = std::chrono::milliseconds(10);
  std::string last = "no attempt made";
  for (;;) {
    AddrInfo ai;
    int rc = resolve(target, port_, /*passive=*/false, ai);
    if (rc != 0) last = std::string("cannot resolve host: ") + ::gai_strerror(rc);
    for (addrinfo* a = rc == 0 ? ai.head : nullptr; a; a = a->ai_next) {
      int fd = connect_one(a, deadline, last);
      if (fd < 0) continue;
      // Handshake.
      const Bytes hello_bytes = encode_hello(token_);
      auto hs_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(1));
      std::string err = send_all(fd, hello_bytes.data(), hello_bytes.size(), hs_deadline);
      uint8_t hello[kHelloReplyBytes];
      if (err.empty()) err = recv_all(fd, hello, sizeof(hello), hs_deadline);
      if (!err.empty()) {
        ::close(fd);
        TANDEM_FAIL("TCPStore: handshake with ", address(), " failed: ", err,
                    "; is another program (not a Tandem TCPStore) listening on that port?");
      }
      Reader r{hello, sizeof(hello)};
      uint32_t magic = r.u32(), version = r.u32();
      uint8_t status = r.u8();
      if (magic != kMagic) {
        ::close(fd);
        TANDEM_FAIL("TCPStore: ", address(), " answered the handshake with magic 0x", std::hex, magic,
                    " instead of 0x", kMagic, std::dec, "; it is not a Tandem TCPStore");
      }
      if (version == kVersion && status == kHelloRefused) {
        ::close(fd);
        TANDEM_FAIL("TCPStore: ", address(), " refused this client: ",
                    token_.empty() ? "the server requires a shared token and this process has none"
                                   : "this process's token does not match the server's",
                    "; set the same TANDEM_STORE_TOKEN for every rank of the job");
      }
      if (version != kVersion || status != kHelloAccepted) {
        ::close(fd);
        TANDEM_FAIL("TCPStore: protocol version mismatch with ", address(), ": this client speaks version ",
                    kVersion, ", the server speaks version ", version,
                    "; run the same Tandem build on every rank");
      }
      fd_ = fd;
      return;
    }
    auto now = Clock::now();
    if (now >= deadline)
      TANDEM_FAIL("TCPStore: could not connect to ", address(), " within ", timeout.count(),
                  " ms (last error: ", last, "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?");
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

Bytes TCPStore::call(const Bytes& request, Millis reply_wait, const char* what) {
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ < 0) connect_locked(timeout_);
  const auto deadline = Clock::now() + reply_wait;
  Writer head;
  head.u32(static_cast<uint32_t>(request.size()));
  std::string err = send_all(fd_, head.b.data(), head.b.size(), deadline);
  if (err.empty()) err = send_all(fd_, request.data(), request.size(), deadline);
  uint8_t lenbuf[4];
  if (err.empty()) err = recv_all(fd_, lenbuf, 4, deadline);
  Bytes body;
  if (err.empty()) {
    uint32_t len = static_cast<uint32_t>(Reader{lenbuf, 4}.u32());
    if (len == 0 || len > kMaxResponseBody) {
      err = "malformed reply of " + std::to_string(len) + " bytes";
    } else {
      body.resize(len);
      err = recv_all(fd_, body.data(), len, deadline);
    }
  }
  if (!err.empty()) {
    close_locked();  // the stream is out of step now; the next call reconnects
    TANDEM_FAIL("TCPStore ", address(), ": ", what, " failed: ", err);
  }
  if (body[0] == kError)
    TANDEM_FAIL("TCPStore ", address(), ": ", what, ": ", std::string(body.begin() + 1, body.end()));
  return body;
}

namespace {
void check_key(const std::string& key, const std::string& addr) {
  TANDEM_CHECK(key.size() <= kMaxKeyBytes, "TCPStore ", addr, ": key of ", key.size(),
               " bytes exceeds the limit of ", kMaxKeyBytes, " bytes");
}
uint64_t timeout_ms(Millis t) { return static_cast<uint64_t>(std::max<int64_t>(t.count(), 0)); }
}  // namespace

void TCPStore::set(const std::string& key, const Bytes& value) {
  check_key(key, address());
  TANDEM_CHECK(value.size() <= kMaxValueBytes, "TCPStore ", address(), ": value of ", value.size(),
               " bytes for key '", key, "' exceeds the limit of ", kMaxValueBytes, " bytes");
  Writer w;
  w.b.reserve(1 + 4 + key.size() + 8 + value.size());
  w.u8(kSet);
  w.str(key);
  w.bytes(value);
  Bytes r = call(w.b, timeout_, "set");
  TANDEM_CHECK(r.size() == 1 && r[0] == kOk, "TCPStore ", address(), ": unexpected reply to set('", key, "')");
}

Bytes TCPStore::get(const std::string& key) {
  check_key(key, address());
  Writer w;
  w.u8(kGet);
  w.str(key);
  w.u64(timeout_ms(timeout_));
  Bytes r = call(w.b, timeout_ + kReplyGrace, "get");
  TANDEM_CHECK(r[0] != kTimeout, "TCPStore ", address(), ": get timed out after ", timeout_.count(),
               " ms waiting for key '", key, "'; did the rank that sets it start and reach that point?");
  TANDEM_CHECK(r[0] == kValue, "TCPStore ", address(), ": unexpected reply to get('", key, "')");
  return Bytes(r.begin() + 1, r.end());
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  check_key(key, address());
  Writer w;
  w.u8(kAdd);
  w.str(key);
  w.u64(static_cast<uint64_t>(delta));
  Bytes r = call(w.b, timeout_, "add");
  TANDEM_CHECK(r.size() == 9 && r[0] == kValue, "TCPStore ", address(), ": unexpected reply to add('", key, "')");
  return static_cast<int64_t>(Reader{r.data() + 1, 8}.u64());
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  TANDEM_CHECK(keys.size() <= kMaxKeysPerRequest, "TCPStore ", address(), ": check of ", keys.size(),
               " keys exceeds the limit of ", kMaxKeysPerRequest);
  Writer w;
  w.u8(kCheck);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) check_key(k, address()), w.str(k);
  Bytes r = call(w.b, timeout_, "check");
  TANDEM_CHECK(r.size() == 2 && r[0] == kValue, "TCPStore ", address(), ": unexpected reply to check");
  return r[1] != 0;
}

void TCPStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  TANDEM_CHECK(keys.size() <= kMaxKeysPerRequest, "TCPStore ", address(), ": wait for ", keys.size(),
               " keys exceeds the limit of ", kMaxKeysPerRequest);
  Writer w;
  w.u8(kWait);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) check_key(k, address()), w.str(k);
  w.u64(timeout_ms(timeout));
  Bytes r = call(w.b, timeout + kReplyGrace, "wait");
  if (r[0] == kTimeout) {
    std::vector<std::string> missing;
    try {
      Reader rd{r.data() + 1, r.size() - 1};
      missing = rd.keys();
    } catch (const Malformed&) {
      missing = keys;
    }
    TANDEM_FAIL("TCPStore ", address(), ": wait timed out after ", timeout.count(), " ms; missing key(s) ",
                join_keys(missing), "; did every rank start and reach that point?");
  }
  TANDEM_CHECK(r[0] == kOk, "TCPStore ", address(), ": unexpected reply to wait");
}

bool TCPStore::delete_key(const std::string& key) {
  check_key(key, address());
  Writer w;
  w.u8(kDelete);
  w.str(key);
  Bytes r = call(w.b, timeout_, "delete");
  TANDEM_CHECK(r.size() == 2 && r[0] == kValue, "TCPStore ", address(), ": unexpected reply to delete('", key,
               "')");
  return r[1] != 0;
}

}  // namespace tandem::dist
