// The TCP store's server (dist/store/tcp_store.h has the protocol): one thread running a poll(2) loop
// over the listening socket, a wake pipe and every accepted connection; internal to dist/.
// Invariant: the server thread alone owns the key map and every accepted socket; the constructor
// and destructor only start and stop it (the destructor wakes and joins it at once).
#pragma once

#include <functional>
#include <list>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dist/store/tcp_store_wire.h"

namespace tandem::dist {

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
    tcp_store_wire::Clock::time_point deadline;
  };
  struct Conn {
    int fd = -1;
    Bytes in;
    size_t in_pos = 0;
    Bytes out;
    size_t out_pos = 0;
    bool hello_done = false;
    tcp_store_wire::Clock::time_point hello_deadline;
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
  tcp_store_wire::Clock::time_point accept_pause_until_{};
};

}  // namespace tandem::dist
