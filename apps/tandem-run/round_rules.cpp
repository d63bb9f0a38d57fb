// The rendezvous' decisions (see round_rules.h).
#include "round_rules.h"

namespace tandem::run {

RoundState round_state(const RoundLimits& l, int joined, double since_start_s, std::optional<double> since_min_s) {
  if (joined >= l.max_nodes) return RoundState::kClose;
  if (joined >= l.min_nodes && since_min_s && *since_min_s >= l.last_call_s) return RoundState::kClose;
  if (joined < l.min_nodes && since_start_s >= l.join_timeout_s) return RoundState::kTimedOut;
  return RoundState::kOpen;
}

std::string assign_node_ranks(const std::vector<RoundAgent>& agents, std::vector<int>& ranks) {
  const int n = static_cast<int>(agents.size());
  ranks.assign(agents.size(), -1);
  bool all_given = n > 0;
  for (const RoundAgent& a : agents) all_given = all_given && a.given_rank >= 0;
  if (all_given) {
    std::vector<int> owner(agents.size(), -1);
    for (int i = 0; i < n; ++i) {
      const int r = agents[static_cast<size_t>(i)].given_rank;
      if (r >= n)
        return "an agent gave --node-rank " + std::to_string(r) + " but only " + std::to_string(n) +
               " node(s) are in the round";
      if (owner[static_cast<size_t>(r)] >= 0)
        return "two agents gave --node-rank " + std::to_string(r) + "; each node needs its own";
      if (agents[static_cast<size_t>(i)].host && r != 0)
        return "the agent on the rendezvous host gave --node-rank " + std::to_string(r) +
               ", but node rank 0 must run on the host of --master-addr / --rdzv-endpoint";
      owner[static_cast<size_t>(r)] = i;
      ranks[static_cast<size_t>(i)] = r;
    }
    return "";
  }
  int next = 1;
  bool host_seen = false;
  for (int i = 0; i < n; ++i) {
    if (agents[static_cast<size_t>(i)].host && !host_seen) {
      ranks[static_cast<size_t>(i)] = 0;
      host_seen = true;
    } else {
      ranks[static_cast<size_t>(i)] = next++;
    }
  }
  if (!host_seen) return "no agent of the round serves the rendezvous store";
  return "";
}

}  // namespace tandem::run
