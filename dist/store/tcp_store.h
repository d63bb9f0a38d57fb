// TCPStore: the rendezvous store of a job, served over TCP by rank 0 and used
// as a client by every rank (rank 0's instance is a client of its own server).
//
// Server: binds `host:port` (port 0 picks a free port; port() reports it) and
// runs one background thread with a poll(2) loop over non-blocking sockets, at
// most kMaxClients connections. Callers pass MASTER_ADDR as host: single-node
// runs use 127.0.0.1 so the store is reachable on loopback only; multi-node runs
// pass the address of rank 0's interface that the other nodes route to. A port
// already in use is one tandem::Error naming host:port. A client that sends
// garbage, a wrong magic, an unknown request, an oversized length, or vanishes
// mid-request is dropped; the server keeps serving everyone else. The server
// instance's destructor wakes and joins the thread promptly (no timeout waited).
//
// Where it listens: the server binds the interface of `host` (MASTER_ADDR), so
// a one-node job with MASTER_ADDR=127.0.0.1 or localhost listens on loopback
// only and is unreachable from other machines. TCPStoreOptions::bind_host (or
// the environment variable TANDEM_STORE_BIND_HOST) overrides it, e.g. 0.0.0.0
// to listen on every interface.
//
// Shared token: when the server's token (TCPStoreOptions::token, else the
// environment variable TANDEM_STORE_TOKEN) is non-empty, a client must present
// the same token in the handshake (compared in constant time) or it is refused
// before it can read or write any key; the client's error says so, and the
// server reports the refusal through TCPStoreOptions::on_refused (default: a
// spdlog warning, at most one a second). The token travels in clear text: it
// keeps out strangers and other jobs, not an eavesdropper on the network.
// A connection that has not finished the handshake within hello_timeout is
// dropped, so idle strangers cannot hold the server's connection slots.
//
// Wire protocol (all integers little-endian):
//   handshake: client sends magic u32, version u32, token length u32, token
//     bytes (<= kMaxTokenBytes). The server drops the connection when the magic
//     is wrong or the token length is over the limit; otherwise it answers
//     magic u32, version u32, status u8 (0 = accepted, 1 = version mismatch,
//     2 = token refused; after 1 or 2 it closes the connection). A version-1
//     client (8-byte hello) is answered "version mismatch" at once.
//   request:  u32 body length, then body = u8 op, payload.
//   response: u32 body length, then body = u8 status, payload.
//   strings:  u32 length + bytes (keys, <= kMaxKeyBytes); values: u64 length + bytes (<= kMaxValueBytes).
//   SET key value -> OK.        GET key timeout_ms u64 -> VALUE value | TIMEOUT.
//   ADD key delta i64 -> VALUE i64 | ERROR message.   CHECK n u32 keys -> VALUE u8.
//   WAIT n u32 keys timeout_ms u64 -> OK | TIMEOUT n u32 missing keys.   DELETE key -> VALUE u8.
// GET and WAIT block on the server (no polling) until the keys exist or the
// client's timeout passes; the server answers TIMEOUT itself at the deadline.
// add() stores decimal text (get() of a counter returns e.g. "3").
//
// Client: connect retries (backoff up to 1 s) until the store's timeout, since
// the server may start later, then throws naming host:port. Every call is one
// request/response under a mutex (thread-safe); a connection that fails mid-call
// is closed and the call throws naming the address; the next call reconnects.
// Blocking socket calls wait at most the call's timeout (+2 s for the reply).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "dist/store/store.h"

namespace tandem::dist {

namespace tcp_store_protocol {
inline constexpr uint32_t kMagic = 0x54444E53;  // "SNDT" on the wire
inline constexpr uint32_t kVersion = 2;  // 2: the handshake carries the token
inline constexpr size_t kMaxTokenBytes = 1024;
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = size_t{64} << 20;
inline constexpr size_t kMaxKeysPerRequest = 65536;
inline constexpr int kMaxClients = 4096;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5, kDelete = 6 };
enum HelloStatus : uint8_t { kHelloAccepted = 0, kHelloVersionMismatch = 1, kHelloRefused = 2 };

// A client's handshake as the server decodes it.
struct Hello {
  uint32_t version = 0;
  std::string token;  // empty for a version other than kVersion (the rest is not read)
};
// Decodes a handshake from the first `avail` received bytes. Returns nullopt
// while more bytes are needed, else the hello and sets *consumed; throws
// tandem::Error (the server drops the client) for a wrong magic or a token
// length over kMaxTokenBytes. Never reads beyond `avail`.
std::optional<Hello> decode_hello(const uint8_t* data, size_t avail, size_t* consumed);
Bytes encode_hello(const std::string& token);

// One request body (the bytes after the u32 frame length), decoded.
struct Request {
  Op op = kSet;
  std::vector<std::string> keys;  // SET/GET/ADD/DELETE: one key; CHECK/WAIT: any number
  Bytes value;                    // SET
  int64_t delta = 0;              // ADD
  uint64_t timeout_ms = 0;        // GET/WAIT
};
// Decodes exactly `n` bytes as one request; throws tandem::Error naming what is
// malformed (unknown op, lengths over the limits or beyond the frame, bytes
// left over). Never reads beyond `n`. The server decodes every frame with it.
Request decode_request(const uint8_t* body, size_t n);
Bytes encode_request(const Request& request);

// Equality that takes the same time wherever the first difference is.
bool constant_time_equal(const std::string& a, const std::string& b);
}  // namespace tcp_store_protocol

struct TCPStoreOptions {
  Millis timeout = kDefaultStoreTimeout;  // connect, and every blocking call
  // Number of store instances (server's own included) expected to join; when
  // set, every instance counts itself in at construction.
  std::optional<int> num_workers;
  // With num_workers set, the server's constructor waits (up to timeout) until all joined.
  bool wait_for_workers = true;
  // Server: the address to listen on; unset = $TANDEM_STORE_BIND_HOST if set, else `host`.
  std::optional<std::string> bind_host;
  // Shared secret for the handshake (server: required of clients when non-empty;
  // client: presented). Unset = $TANDEM_STORE_TOKEN (empty when that is unset).
  std::optional<std::string> token;
  // Server: how long a new connection may take to complete the handshake.
  Millis hello_timeout = std::chrono::seconds(30);
  // Client: what a failure to connect suggests checking (names who serves this store).
  std::string unreachable_hint = "is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?";
  // Server: called on the server thread with one line for each refused client
  // (wrong token, wrong magic, handshake timeout); unset = spdlog warning, rate-limited.
  std::function<void(const std::string&)> on_refused;
};

class TCPStoreServer;  // the background server (dist/store/tcp_store_server.h)

class TCPStore : public Store {
 public:
  TCPStore(std::string host, int port, bool is_server, TCPStoreOptions options = {});
  ~TCPStore() override;
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool delete_key(const std::string& key) override;
  std::string address() const override;  // "tcp://host:port"

  const std::string& host() const { return host_; }
  int port() const { return port_; }  // the bound port when the server was given port 0
  bool is_server() const { return server_ != nullptr; }

 private:
  // One request/response; `reply_wait` bounds how long the reply may take.
  Bytes call(const Bytes& request, Millis reply_wait, const char* what);
  void connect_locked(Millis timeout);
  void close_locked();
  void join_workers(const TCPStoreOptions& options);

  std::string host_;
  int port_;
  std::string token_;  // what this client presents in the handshake
  std::string unreachable_hint_;
  std::unique_ptr<TCPStoreServer> server_;
  std::mutex mu_;
  int fd_ = -1;
};

}  // namespace tandem::dist
