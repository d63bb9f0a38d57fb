// The c10d rendezvous backend (see store_rendezvous.h).
#include "store_rendezvous.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "console.h"
#include "core/error.h"
#include "dist/store/tcp_store.h"
#include "port.h"
#include "round_rules.h"
#include "token.h"

namespace tandem::run {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
constexpr auto kPoll = std::chrono::milliseconds(100);

dist::Millis millis(double seconds) { return dist::Millis(static_cast<int64_t>(seconds * 1000)); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

StoreRendezvous::StoreRendezvous(const RunOptions& o) : Rendezvous(o), prefix_("tandem-run/" + o.run_id + "/") {
  dist::TCPStoreOptions so;
  so.token = job_token(o);
  so.timeout = millis(o.store_timeout);
  so.bind_host = o.master_addr;  // only the agent on that host may serve it
  so.on_refused = [](const std::string& line) { say("rendezvous store: " + line); };
  so.unreachable_hint =
      "is node rank 0's tandem-run (the rendezvous host) running, and are --master-addr/--master-port right?";
  const bool may_host = !o.node_rank_given || o.node_rank == 0;
  if (may_host) {
    try {
      store_ = std::make_unique<dist::TCPStore>(o.master_addr, o.master_port, true, so);
      host_ = true;
    } catch (const Error& e) {
      if (o.node_rank_given)  // node rank 0 must serve it: nothing to fall back to
        throw RendezvousError("node rank 0 cannot serve the rendezvous store on " + o.master_addr + ":" +
                              std::to_string(o.master_port) + ": " + e.what() +
                              " (run node rank 0 on that host, or choose another --master-port)");
    }
  }
  if (!store_) {
    so.timeout = millis(o.join_timeout);  // the host's agent may start later
    try {
      store_ = std::make_unique<dist::TCPStore>(o.master_addr, o.master_port, false, so);
    } catch (const Error& e) {
      throw RendezvousError("cannot reach the rendezvous store at tcp://" + o.master_addr + ":" +
                            std::to_string(o.master_port) + " within join_timeout=" + seconds_text(o.join_timeout) +
                            ": " + e.what());
    }
    store_->set_timeout(millis(o.store_timeout));
  }
}

StoreRendezvous::~StoreRendezvous() { stop_watch(); }

std::string StoreRendezvous::address() const { return "tcp://" + o_.master_addr + ":" + std::to_string(o_.master_port); }

std::string StoreRendezvous::key(int round, const std::string& name) const {
  return prefix_ + "r" + std::to_string(round) + "/" + name;
}

namespace {

// Runs a store call; a store error becomes a RendezvousError naming the store.
template <typename F>
auto guarded(const std::string& address, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw RendezvousError("cannot reach the rendezvous store at " + address + ": " + e.what());
  }
}

}  // namespace

int64_t StoreRendezvous::poll_count(const std::string& k) {
  return guarded(address(), [&] { return store_->add(k, 0); });
}

std::string StoreRendezvous::await_key(const std::string& k, Clock::time_point start, double limit,
                                  const std::string& why_not) {
  while (!guarded(address(), [&] { return store_->check({k}); })) {
    throw_if_signalled();
    if (seconds_since(start) >= limit) throw RendezvousError(why_not);
    std::this_thread::sleep_for(kPoll);
  }
  return guarded(address(), [&] { return store_->get_string(k); });
}

int StoreRendezvous::first_round() {
  if (host_) return 0;
  return std::stoi(await_key(prefix_ + "open", Clock::now(), o_.join_timeout,
                             "the rendezvous host at " + address() + " opened no round within join_timeout=" +
                                 seconds_text(o_.join_timeout)));
}

void StoreRendezvous::close_round(int round) {
  const RoundLimits limits{o_.min_nodes, o_.nnodes, o_.last_call_timeout, o_.join_timeout};
  const auto start = Clock::now();
  std::optional<Clock::time_point> min_at;
  int joined = 0;
  for (;;) {
    joined = static_cast<int>(poll_count(key(round, "joined")));
    if (joined >= o_.min_nodes && !min_at) min_at = Clock::now();
    const RoundState state = round_state(limits, joined, seconds_since(start),
                                         min_at ? std::optional<double>(seconds_since(*min_at)) : std::nullopt);
    if (state == RoundState::kClose) break;
    if (state == RoundState::kTimedOut) {
      const std::string why = "rendezvous round " + std::to_string(round) + " timed out: " + std::to_string(joined) +
                              " of " + std::to_string(o_.min_nodes) + " node(s) joined within join_timeout=" +
                              seconds_text(o_.join_timeout);
      guarded(address(), [&] { store_->set_string(key(round, "closed"), Json{{"error", why}}.dump()); });
      throw RendezvousError(why);
    }
    throw_if_signalled();
    std::this_thread::sleep_for(kPoll);
  }
  std::vector<RoundAgent> agents;
  for (int i = 0; i < joined; ++i) {
    const Json a = Json::parse(
        guarded(address(), [&] { return store_->get_string(key(round, "agent" + std::to_string(i))); }));
    agents.push_back({a.value("given_rank", -1), a.value("host", false)});
  }
  std::vector<int> ranks;
  Json closed;
  if (std::string err = assign_node_ranks(agents, ranks); !err.empty())
    closed = {{"error", "rendezvous round " + std::to_string(round) + ": " + err}};
  else
    closed = {{"ranks", ranks}, {"master_addr", o_.master_addr}, {"master_port", pick_free_port_any()}};
  guarded(address(), [&] { store_->set_string(key(round, "closed"), closed.dump()); });
}

Round StoreRendezvous::join(int round) {
  const auto start = Clock::now();
  for (;; ++round) {
    const int index = static_cast<int>(guarded(address(), [&] { return store_->add(key(round, "joined"), 1); })) - 1;
    const Json me = {{"given_rank", o_.node_rank_given ? o_.node_rank : -1}, {"host", host_}, {"name", hostname()}};
    guarded(address(), [&] { store_->set_string(key(round, "agent" + std::to_string(index)), me.dump()); });
    if (host_) {
      guarded(address(), [&] { store_->set_string(prefix_ + "open", std::to_string(round)); });
      close_round(round);
    }
    // Everyone else waits for the host's decision (its own wait is bounded by join_timeout, plus the
    // last-call window and a store call's time to tell).
    const double limit = o_.join_timeout + o_.last_call_timeout + o_.store_timeout;
    const Json closed = Json::parse(await_key(
        key(round, "closed"), start, limit,
        "rendezvous round " + std::to_string(round) + " at " + address() + " did not close within " +
            seconds_text(limit) +
            " (join_timeout + last_call_timeout + timeout); is the host's agent running (a job already at its "
            "most nodes takes no more)?"));
    if (closed.contains("error")) throw RendezvousError(closed["error"].get<std::string>());
    const std::vector<int> ranks = closed["ranks"].get<std::vector<int>>();
    if (index >= static_cast<int>(ranks.size())) {
      say("rendezvous round " + std::to_string(round) + " closed before this node joined; waiting for round " +
          std::to_string(round + 1));
      continue;
    }
    Round r;
    r.round = round;
    r.node_rank = ranks[static_cast<size_t>(index)];
    r.nnodes = static_cast<int>(ranks.size());
    r.master_addr = closed["master_addr"].get<std::string>();
    r.master_port = closed["master_port"].get<int>();
    return r;
  }
}

void StoreRendezvous::record_failure(int round, const Failure& f) {
  Failure mine = f;
  mine.host = hostname();
  const int64_t k = guarded(address(), [&] { return store_->add(key(round, "failures"), 1); });
  guarded(address(),
          [&] { store_->set_string(key(round, "failure" + std::to_string(k)), mine.json().dump()); });
}

std::optional<Failure> StoreRendezvous::failure(int round) {
  const int64_t n = poll_count(key(round, "failures"));
  std::optional<Failure> first;
  for (int64_t k = 1; k <= n; ++k) {
    const std::string fk = key(round, "failure" + std::to_string(k));
    // Written right after its count; an agent that died in between leaves a gap.
    try {
      store_->wait({fk}, std::chrono::seconds(2));
    } catch (const Error&) {
      continue;
    }
    const Failure f = Failure::from(Json::parse(guarded(address(), [&] { return store_->get_string(fk); })));
    if (f.signal != 0) return f;
    if (!first) first = f;
  }
  return first;
}

void StoreRendezvous::finish(int round, int nnodes) {
  try {
    store_->add(key(round, "done"), 1);
    if (!host_) return;  // nothing more is asked of the store; only its host must stay for the others
    const auto start = Clock::now();
    while (store_->add(key(round, "done"), 0) < nnodes && store_->add(key(round, "failures"), 0) == 0) {
      if (seconds_since(start) >= o_.store_timeout) {
        say("warning: not every node reported its workers done within timeout=" + seconds_text(o_.store_timeout) +
            "; leaving the rendezvous");
        return;
      }
      throw_if_signalled();
      std::this_thread::sleep_for(kPoll);
    }
  } catch (const Error&) {
    // This node's workers succeeded; a store gone now changes nothing for it.
  }
}

void StoreRendezvous::leave(int round, int nnodes) {
  try {
    store_->add(key(round, "left"), 1);
    const auto start = Clock::now();
    // The others read the outcome once their own workers have ended: within the grace period.
    const double bound = o_.grace_seconds + std::min(o_.store_timeout, 5.0);
    while (host_ && store_->add(key(round, "left"), 0) < nnodes && seconds_since(start) < bound)
      std::this_thread::sleep_for(kPoll);
  } catch (const Error&) {
    // Leaving anyway: nothing more is asked of the store.
  }
}

std::string StoreRendezvous::lost_text(const std::string& error) const {
  return "cannot reach the rendezvous store at " + address() + " for " + seconds_text(o_.store_timeout) +
         " (timeout): " + error;
}

std::string StoreRendezvous::watch_once(int round, int nnodes) {
  const std::string first_failure = key(round, "failure1");
  if (store_->check({first_failure}))
    return "round " + std::to_string(round) + " failed on another node: " +
           Failure::from(Json::parse(store_->get_string(first_failure))).line();
  if (nnodes < o_.nnodes && round < o_.max_restarts) {
    const int64_t waiting = store_->add(key(round + 1, "joined"), 0);
    if (waiting > 0) return scale_up_reason(waiting, round, nnodes);
  }
  return "";
}

}  // namespace tandem::run
