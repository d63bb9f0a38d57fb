// The TCP store's server (dist/store/tcp_store_server.h): accepting, the handshake and its token check,
// framing, the ops, and the GET/WAIT requests parked until their keys exist or their deadline
// passes. A malformed or refused client is dropped with a reason; the others never notice.
#include "dist/store/tcp_store_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace tandem::dist {

using namespace tcp_store_wire;

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
}  // namespace tandem::dist
