// TCPStore, the client (dist/store/tcp_store.h), and the server it starts when it is the rank that hosts
// the store (dist/store/tcp_store_server.h). Every socket is non-blocking and every wait a poll(2) with
// a deadline, so no call outlives its timeout; one mutex serialises the calls on the connection.
#include "dist/store/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "dist/store/tcp_store_server.h"
#include "dist/store/tcp_store_wire.h"

namespace tandem::dist {

using namespace tcp_store_wire;

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
  if (connected_to_itself(fd)) {
    err = "the connection reached itself (nothing listened on that port yet)";
    ::close(fd);
    return -1;
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
  unreachable_hint_ = options.unreachable_hint;
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
                  " ms (last error: ", last, "); ", unreachable_hint_);
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
