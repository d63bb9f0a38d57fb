// The agents' rendezvous of a multi-node job (--nnodes N > 1 or MIN:MAX), torchrun's c10d backend
// in small: the agent that can bind the rendezvous address (--master-addr:--master-port, or
// --rdzv-endpoint) serves a dist::TCPStore there; every agent, that one included, is a client.
// With --node-rank given, only node rank 0 tries to serve it (and fails with a clear error when it
// cannot), as torchrun's static backend.
//
// Keys, under "tandem-run/<run id>/r<round>/": joined (counter: the arrival index), agent<i> (JSON of
// agent i), closed (JSON: the round's node ranks and the workers' MASTER_ADDR/MASTER_PORT, or why it
// failed), failures (counter) and failure<k> (JSON of the k-th worker failure in the round), done
// (counter of nodes whose workers all succeeded). "tandem-run/<run id>/open" is the round the store
// host last opened: an agent starting late joins that one.
//
// The store host closes each round (round_rules.h), picks a free port for the workers' own store
// and publishes it in `closed`; an agent that joined a round after it closed waits for the next.
// Every wait is bounded: joining by join_timeout, each store call by timeout, and a store that stays
// unreachable for timeout ends the agent with an error naming its address. SIGINT/SIGTERM/SIGHUP/
// SIGQUIT arriving while an agent waits here end the wait (RendezvousInterrupted).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "options.h"

namespace tandem::dist {
class TCPStore;
}

namespace tandem::run {

struct RendezvousError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct RendezvousInterrupted : std::runtime_error {
  explicit RendezvousInterrupted(int sig) : std::runtime_error("interrupted"), signal(sig) {}
  int signal;
};

// One closed round, as this agent takes part in it.
struct Round {
  int round = 0;
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr;  // the workers' store (node rank 0's workers serve it)
  int master_port = 0;
};

// A worker failure as recorded in the store.
struct Failure {
  int node = -1;
  int rank = -1;
  int exit_code = 1;
  int signal = 0;       // the signal that killed the rank, 0 when it exited
  std::string what;     // "was killed by SIGKILL (exit code 137)"
  std::string host;     // the agent's host name
  bool final = false;   // the agent will not rejoin (interrupted, or its workers could not start)
  std::string line() const;  // "node 1 (host b) rank 3 was killed by SIGKILL (exit code 137)"
};

class Rendezvous {
 public:
  explicit Rendezvous(const RunOptions& o);  // serves or connects; throws RendezvousError
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  bool is_host() const { return host_; }
  std::string address() const;  // "tcp://host:port"

  int first_round();        // the round a starting agent joins
  Round join(int round);    // joins `round` (or, when it closed without this agent, a later one)
  void record_failure(int round, const Failure& f);
  // The failure that ends `round`: the first recorded rank killed by a signal, else the first recorded.
  std::optional<Failure> failure(int round);
  // Counts this node done; the store host then waits (bounded by the store timeout) until every node
  // of the round is done, or one failed, so that no agent loses the store before its workers end.
  void finish(int round, int nnodes);
  // Says this agent has read the round's outcome and is leaving; the store host waits (bounded by the
  // grace period plus min(timeout, 5 s)) until all `nnodes` did, so that none loses the store first.
  void leave(int round, int nnodes);

  // Watches `round` (of `nnodes` nodes) on a thread while the workers run: stop_reason() is then
  // non-empty once another node recorded a failure, once the store stayed unreachable for the store
  // timeout, or (with fewer than MAX nodes and restarts left) once an agent waits in the next round,
  // so that the group restarts with it, as torchrun's scale-up.
  void start_watch(int round, int nnodes);
  void stop_watch();
  std::string stop_reason();
  bool store_lost();

 private:
  std::string key(int round, const std::string& name) const;
  void close_round(int round);
  int64_t poll_count(const std::string& key);
  // The value of `k` once it exists (polled, stop signals honoured); `why_not` is thrown when it does not
  // by `limit` seconds after `start`.
  std::string await_key(const std::string& k, std::chrono::steady_clock::time_point start, double limit, const std::string& why_not);
  void watch_loop(int round, int nnodes);

  RunOptions o_;
  std::string prefix_;
  bool host_ = false;
  std::unique_ptr<dist::TCPStore> store_;
  std::thread watcher_;
  std::atomic<bool> watching_{false};
  std::mutex reason_mu_;
  std::string reason_;
  bool lost_ = false;
};

}  // namespace tandem::run
