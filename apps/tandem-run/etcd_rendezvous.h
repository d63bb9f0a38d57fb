// The etcd rendezvous backend (--rdzv-backend etcd, or etcd-v2 as torchrun also spells it;
// --rdzv-endpoint HOST:PORT[,HOST:PORT...] names the etcd members). No agent serves anything: the
// rounds, the restart agreement and each round's workers' store address live in etcd, so losing any
// one host, node rank 0's included, costs one restart and not the job.
//
// Every agent holds a lease (TTL: the rendezvous timeout, 2 to 10 s) renewed on its own thread; its
// key "alive/<id>" is bound to it, so a dead agent's key expires. <id> is the agent's number in the
// job, from a counter incremented by compare-and-swap; it orders the nodes. Keys, under
// "/tandem-run/<run id>/":
//   seq                       the counter of agent ids
//   alive/<id>                JSON of the agent (host name, address), bound to its lease
//   open                      the round last joined: an agent starting late joins that one
//   r<N>                      JSON of round N: {"agents": [...], "closed": {...}} once closed
//   r<N>/failure/<id>         a failure of node <id> in round N (recorded by it, or for it when its
//                             lease expired)
//   r<N>/done/<id>, left/<id> node <id>'s workers succeeded / its agent read the outcome
//   ended                     {"ok", "round"} once the job succeeded or an agent gave up: an agent
//                             waiting to join (a spare beyond MAX nodes) then leaves, exit code 0
//                             after a success
// so every job needs its own --rdzv-id (as torchrun asks).
// Joining and closing a round are compare-and-swap transactions on r<N>'s mod revision, so concurrent
// joins cannot split a round and an agent that joins after the close waits for the next one. Any agent
// of the round may close it (round_rules.h decides when, from what it saw), dropping the agents whose
// lease expired; node ranks go by agent id (given --node-rank when every agent gave one), and the
// lowest, node rank 0, hosts the workers' TCPStore at its address (--local-addr, else its source
// address towards the first etcd member) and a port it picked when it joined.
//
// While workers run, the watch stops them when another node recorded a failure, when a node of the
// round lost its lease (recorded as its failure: one restart), or when an agent waits in the next
// round (scale-up). etcd calls that fail are retried until the rendezvous timeout; then the agent ends
// with an error naming the endpoints and the cause: no member reachable, or no quorum. A lease that
// etcd dropped (this agent was cut off longer than its TTL) ends the agent: the others count it lost.
#pragma once

#include <memory>
#include <vector>

#include "etcd_client.h"
#include "rendezvous.h"

namespace tandem::run {

class EtcdRendezvous : public Rendezvous {
 public:
  explicit EtcdRendezvous(const RunOptions& o);  // takes a lease and an id; throws RendezvousError
  ~EtcdRendezvous() override;

  bool is_host() const override { return false; }  // no agent serves anything
  std::string address() const override;              // "etcd://HOST:PORT,..."
  int first_round() override;                        // the "open" key's round, else 0
  // Enters the round by compare-and-swap, then waits for its close (closing it when the rules say so).
  Round join(int round) override;
  void record_failure(int round, const Failure& f) override;  // r<N>/failure/<id>
  std::optional<Failure> failure(int round) override;
  void finish(int round, int nnodes) override;  // r<N>/done/<id>, and "ended" (a success)
  void leave(int round, int nnodes) override;   // r<N>/left/<id>, and "ended" (the job gave up)

 protected:
  // A failure recorded in the round, a node of the round whose lease expired, or a scale-up.
  std::string watch_once(int round, int nnodes) override;
  std::string lost_text(const std::string& error) const override;

 private:
  struct Member {
    int64_t id = 0;
    int node_rank = 0;
    std::string name;
  };
  template <typename F>
  auto retry(F&& f) -> decltype(f());
  std::string round_key(int round) const { return prefix_ + "r" + std::to_string(round); }
  std::string sub_key(int round, const std::string& what, int64_t id) const;
  bool enter(int round);                                       // false: the round closed first
  nlohmann::json await_close(int round, std::chrono::steady_clock::time_point start);
  void try_close(int round, nlohmann::json state, int64_t mod_revision);
  void leave_round(int round);  // after a join timeout: takes this agent out of the open round
  void keep_alive_loop();

  std::string prefix_;
  std::string local_addr_;
  int ttl_ = 10;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<EtcdClient> keeper_etcd_;  // the lease's own, so that a slow call never delays it
  int64_t lease_ = 0;
  int64_t id_ = 0;
  std::vector<Member> members_;  // of the round joined last
  std::thread keeper_;
  std::atomic<bool> keeping_{false};
};

}  // namespace tandem::run
