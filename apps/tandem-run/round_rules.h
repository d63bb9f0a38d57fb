// The rendezvous' decisions, without any store or clock (rendezvous.h applies them): when a round
// closes, and which node rank each agent of a closed round gets. As torchrun's c10d rendezvous: a
// round closes at once when MAX agents joined, or once at least MIN joined and the last-call window
// (counted from the moment MIN was reached) has passed; the join timeout ends a round that never
// reached MIN.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tandem::run {

struct RoundLimits {
  int min_nodes = 1;
  int max_nodes = 1;
  double last_call_s = 2.0;
  double join_timeout_s = 600.0;
};

enum class RoundState { kOpen, kClose, kTimedOut };

// `joined` agents so far; `since_start_s` since the round opened; `since_min_s` since `joined` first
// reached MIN (nullopt while it has not).
RoundState round_state(const RoundLimits& l, int joined, double since_start_s, std::optional<double> since_min_s);

// One agent of a round, in arrival order (its index in the round is its position).
struct RoundAgent {
  int given_rank = -1;  // --node-rank, -1 when not given
  bool host = false;    // serves the rendezvous store (its address is the workers' MASTER_ADDR)
};

// Node ranks for the agents that made the round, by arrival index: the store host 0 and the others by
// arrival, or the given ranks when every agent gave one. Returns "" or what is wrong (two agents with
// one node rank, a given rank >= the node count, a host that is not node rank 0).
std::string assign_node_ranks(const std::vector<RoundAgent>& agents, std::vector<int>& ranks);

}  // namespace tandem::run
