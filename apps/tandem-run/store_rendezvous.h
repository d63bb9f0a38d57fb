// The c10d (and static) rendezvous backend, torchrun's c10d design in small: the agent that can bind
// the rendezvous address (--master-addr:--master-port, or --rdzv-endpoint) serves a dist::TCPStore
// there; every agent, that one included, is a client. With --node-rank given, only node rank 0 tries
// to serve it (and fails with a clear error when it cannot), as torchrun's static backend. The store
// takes the job's token (TANDEM_STORE_TOKEN, else --rdzv-id): a client without it is refused.
//
// Keys, under "tandem-run/<run id>/r<round>/": joined (counter: the arrival index), agent<i> (JSON of
// agent i), closed (JSON: the round's node ranks and the workers' MASTER_ADDR/MASTER_PORT, or why it
// failed), failures (counter) and failure<k> (JSON of the k-th worker failure in the round), done
// (counter of nodes whose workers all succeeded). "tandem-run/<run id>/open" is the round the store
// host last opened: an agent starting late joins that one.
//
// The store host closes each round (round_rules.h), picks a free port for the workers' own store
// and publishes it in `closed`; an agent that joined a round after it closed waits for the next.
// Every store call is bounded by the timeout; a failure reads "cannot reach the rendezvous store at
// tcp://HOST:PORT: ...".
#pragma once

#include <memory>

#include "rendezvous.h"

namespace tandem::dist {
class TCPStore;
}

namespace tandem::run {

class StoreRendezvous : public Rendezvous {
 public:
  explicit StoreRendezvous(const RunOptions& o);  // serves or connects; throws RendezvousError
  ~StoreRendezvous() override;

  bool is_host() const override { return host_; }
  std::string address() const override;

  int first_round() override;
  Round join(int round) override;
  void record_failure(int round, const Failure& f) override;
  std::optional<Failure> failure(int round) override;
  // The store host then waits (bounded by the store timeout) until every node of the round is done, or
  // one failed, so that no agent loses the store before its workers end.
  void finish(int round, int nnodes) override;
  // The store host waits (bounded by the grace period plus min(timeout, 5 s)) until all `nnodes` left,
  // so that none loses the store first.
  void leave(int round, int nnodes) override;

 protected:
  std::string watch_once(int round, int nnodes) override;
  std::string lost_text(const std::string& error) const override;

 private:
  std::string key(int round, const std::string& name) const;
  void close_round(int round);
  int64_t poll_count(const std::string& key);
  // The value of `k` once it exists (polled, stop signals honoured); `why_not` is thrown when it does not
  // by `limit` seconds after `start`.
  std::string await_key(const std::string& k, std::chrono::steady_clock::time_point start, double limit,
                        const std::string& why_not);

  std::string prefix_;
  bool host_ = false;
  std::unique_ptr<dist::TCPStore> store_;
};

}  // namespace tandem::run
