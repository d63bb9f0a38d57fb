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
// Wire protocol (all integers little-endian):
//   handshake: client sends magic u32, version u32. The server drops the
//     connection when the magic is wrong; otherwise it answers magic u32,
//     version u32, status u8 (0 = accepted, 1 = version mismatch, then it drops).
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

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "dist/store.h"

namespace tandem::dist {

namespace tcp_store_protocol {
inline constexpr uint32_t kMagic = 0x54444E53;  // "SNDT" on the wire
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = size_t{64} << 20;
inline constexpr size_t kMaxKeysPerRequest = 65536;
inline constexpr int kMaxClients = 4096;
}  // namespace tcp_store_protocol

struct TCPStoreOptions {
  Millis timeout = kDefaultStoreTimeout;  // connect, and every blocking call
  // Number of store instances (server's own included) expected to join; when
  // set, every instance counts itself in at construction.
  std::optional<int> num_workers;
  // With num_workers set, the server's constructor waits (up to timeout) until all joined.
  bool wait_for_workers = true;
};

class TCPStoreServer;  // the background server (tcp_store.cpp)

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
  std::unique_ptr<TCPStoreServer> server_;
  std::mutex mu_;
  int fd_ = -1;
};

}  // namespace tandem::dist
