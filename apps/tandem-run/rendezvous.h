// The agents' rendezvous of a multi-node job (--nnodes N > 1 or MIN:MAX), as torchrun's: agents meet
// in rounds, each closed round gives every agent its node rank and the workers' store address, and
// restarts are agreed through it (agent.h). Two backends, by --rdzv-backend:
//   c10d / static  a dist::TCPStore served by one agent (store_rendezvous.h): that host is a single
//                  point of failure.
//   etcd / etcd-v2 an etcd cluster (etcd_rendezvous.h): leases, compare-and-swap rounds, and the
//                  workers' store hosted each round by the lowest surviving node.
// Every wait is bounded: joining by join_timeout, each call by the rendezvous timeout, and a rendezvous
// that stays unreachable for that timeout ends the agent with an error naming its address.
// SIGINT/SIGTERM/SIGHUP/SIGQUIT arriving while an agent waits here end the wait (RendezvousInterrupted).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "options.h"

namespace tandem::run {

struct RendezvousError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The job ended while this agent waited to join (etcd: a standby agent after the others succeeded).
struct RendezvousFinished : std::runtime_error {
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

// A worker failure as recorded in the rendezvous.
struct Failure {
  int node = -1;
  int rank = -1;
  int exit_code = 1;
  int signal = 0;       // the signal that killed the rank, 0 when it exited
  std::string what;     // "was killed by SIGKILL (exit code 137)"
  std::string host;     // the agent's host name
  bool final = false;   // the agent will not rejoin (interrupted, or its workers could not start)
  std::string line() const;  // "node 1 (host b) rank 3 was killed by SIGKILL (exit code 137)"
  nlohmann::json json() const;
  static Failure from(const nlohmann::json& j);
};

class Rendezvous {
 public:
  virtual ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  virtual bool is_host() const = 0;          // serves the rendezvous (c10d's store host)
  virtual std::string address() const = 0;   // "tcp://host:port", "etcd://a:2379,b:2379"

  virtual int first_round() = 0;        // the round a starting agent joins
  virtual Round join(int round) = 0;    // joins `round` (or, when it closed without this agent, a later one)
  virtual void record_failure(int round, const Failure& f) = 0;
  // The failure that ends `round`: the first recorded rank killed by a signal, else the first recorded.
  virtual std::optional<Failure> failure(int round) = 0;
  // Counts this node done (c10d: its store host then waits, bounded, for every node of the round).
  virtual void finish(int round, int nnodes) = 0;
  // Says this agent has read the round's outcome and is leaving.
  virtual void leave(int round, int nnodes) = 0;

  // Watches `round` (of `nnodes` nodes) on a thread while the workers run: stop_reason() is then
  // non-empty once another node recorded a failure or was lost, once the rendezvous stayed unreachable
  // for its timeout, or (with fewer than MAX nodes and restarts left) once an agent waits in the next
  // round, so that the group restarts with it, as torchrun's scale-up.
  void start_watch(int round, int nnodes);
  void stop_watch();
  std::string stop_reason();
  bool store_lost();
  std::string lost_reason();  // why the rendezvous was lost ("" while it was not)

 protected:
  explicit Rendezvous(const RunOptions& o) : o_(o) {}
  // One look at the running round: why its workers must stop, or "". Throws (any std::exception)
  // when the rendezvous cannot be reached; the watch retries until the timeout has passed.
  virtual std::string watch_once(int round, int nnodes) = 0;
  // The reason given when the rendezvous stayed unreachable for the timeout (`error`: the last one).
  virtual std::string lost_text(const std::string& error) const = 0;
  // Ends the watch and the agent: the rendezvous is lost (`why` says how). When the running watch
  // already gave another reason to stop, `why` is said at once (nothing else would say it).
  void set_lost(const std::string& why);
  // The stop reason when `waiting` agents wait in the round after `round` (of `nnodes` nodes).
  std::string scale_up_reason(int64_t waiting, int round, int nnodes) const;

  RunOptions o_;

 private:
  void watch_loop(int round, int nnodes);
  std::thread watcher_;
  std::atomic<bool> watching_{false};
  std::mutex reason_mu_;
  std::string reason_;
  std::string lost_reason_;
  bool lost_ = false;
};

// The backend that --rdzv-backend names; throws RendezvousError when it cannot start.
std::unique_ptr<Rendezvous> make_rendezvous(const RunOptions& o);

// Helpers of the backends.
std::string hostname();
std::string seconds_text(double s);
// A stop signal that arrived while waiting (they are blocked: main() takes them synchronously).
void throw_if_signalled();

}  // namespace tandem::run
