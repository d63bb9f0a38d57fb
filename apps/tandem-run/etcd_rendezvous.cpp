// The etcd rendezvous backend (see etcd_rendezvous.h).
#include "etcd_rendezvous.h"

#include <algorithm>
#include <set>

#include "console.h"
#include "port.h"
#include "round_rules.h"

namespace tandem::run {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
constexpr auto kPoll = std::chrono::milliseconds(200);

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string host_of(const std::string& endpoint) {
  std::string e = etcd_url(endpoint);
  e = e.substr(e.find("://") + 3);
  return e.substr(0, e.rfind(':'));
}

int port_of(const std::string& endpoint) {
  const std::string e = etcd_url(endpoint);
  return std::stoi(e.substr(e.rfind(':') + 1));
}

// The agent ids whose "alive" key (bound to their lease) still exists.
std::set<int64_t> living(EtcdClient& etcd, const std::string& prefix) {
  std::set<int64_t> ids;
  for (const auto& [key, value] : etcd.get_prefix(prefix + "alive/")) ids.insert(std::stoll(key.substr(key.rfind('/') + 1)));
  return ids;
}

int64_t id_of(const std::string& key) { return std::stoll(key.substr(key.rfind('/') + 1)); }

}  // namespace

template <typename F>
auto EtcdRendezvous::retry(F&& f) -> decltype(f()) {
  const auto start = Clock::now();
  for (;;) {
    if (store_lost()) throw RendezvousError(lost_reason());
    try {
      return f();
    } catch (const EtcdError& e) {
      if (e.kind == EtcdError::Kind::kLeaseLost || e.kind == EtcdError::Kind::kRefused) throw RendezvousError(e.what());
      if (seconds_since(start) >= o_.store_timeout) throw RendezvousError(lost_text(e.what()));
    }
    throw_if_signalled();
    std::this_thread::sleep_for(kPoll);
  }
}

EtcdRendezvous::EtcdRendezvous(const RunOptions& o) : Rendezvous(o), prefix_("/tandem-run/" + o.run_id + "/") {
  // A call waits for etcd at most this long: a member without quorum holds a request for 7 s before it
  // says so, and two such waits must fit in the rendezvous timeout.
  const double request_timeout = std::clamp(o.store_timeout / 2, 1.0, 5.0);
  try {
    etcd_ = std::make_unique<EtcdClient>(o.etcd_endpoints, request_timeout);
    keeper_etcd_ = std::make_unique<EtcdClient>(o.etcd_endpoints, request_timeout);
    local_addr_ = o.local_addr.empty() ? local_address_towards(host_of(o.etcd_endpoints.front()),
                                                               port_of(o.etcd_endpoints.front()))
                                       : o.local_addr;
  } catch (const std::exception& e) {
    throw RendezvousError(std::string("etcd rendezvous: ") + e.what());
  }
  ttl_ = static_cast<int>(std::clamp(o.store_timeout, 2.0, 10.0));
  lease_ = retry([&] { return etcd_->grant_lease(ttl_); });
  id_ = retry([&] {
    for (;;) {
      const auto seq = etcd_->get(prefix_ + "seq");
      const int64_t next = (seq ? std::stoll(seq->value) : 0) + 1;
      if (etcd_->put_if(prefix_ + "seq", seq ? seq->mod_revision : 0, std::to_string(next))) return next;
    }
  });
  const Json me = {{"name", hostname()}, {"addr", local_addr_}};
  retry([&] { etcd_->put(prefix_ + "alive/" + std::to_string(id_), me.dump(), lease_); });
  keeping_ = true;  // last: a constructor that throws leaves no thread behind
  keeper_ = std::thread([this] { keep_alive_loop(); });
}

EtcdRendezvous::~EtcdRendezvous() {
  stop_watch();
  keeping_ = false;
  if (keeper_.joinable()) keeper_.join();
  if (store_lost()) return;  // etcd cannot be used: the lease ends by itself
  try {                      // this agent's alive key goes at once rather than at the lease's end
    etcd_->revoke(lease_);
  } catch (const std::exception&) {
  }
}

std::string EtcdRendezvous::address() const {
  std::string out;
  for (const std::string& e : o_.etcd_endpoints) out += (out.empty() ? "" : ",") + e;
  return "etcd://" + out;
}

std::string EtcdRendezvous::lost_text(const std::string& error) const {
  return "the etcd rendezvous at " + address() + " could not be used for " + seconds_text(o_.store_timeout) +
         " (timeout): " + error;
}

std::string EtcdRendezvous::sub_key(int round, const std::string& what, int64_t id) const {
  return round_key(round) + "/" + what + "/" + std::to_string(id);
}

void EtcdRendezvous::keep_alive_loop() {
  std::optional<Clock::time_point> failing_since;
  const auto period = std::chrono::milliseconds(ttl_ * 1000 / 3);
  auto next = Clock::now() + period;
  while (keeping_) {
    if (Clock::now() < next) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    next = Clock::now() + period;
    const auto tried = Clock::now();
    try {
      keeper_etcd_->keep_alive(lease_);
      failing_since.reset();
    } catch (const EtcdError& e) {
      if (e.kind == EtcdError::Kind::kLeaseLost) {
        set_lost("this agent's etcd lease expired (" + std::string(e.what()) + "): it could not renew it within " +
                 std::to_string(ttl_) + " s, and the other agents count this node lost");
        return;
      }
      if (!failing_since) failing_since = tried;
      if (seconds_since(*failing_since) >= o_.store_timeout) {
        set_lost(lost_text(std::string("renewing this agent's lease: ") + e.what()));
        return;
      }
    } catch (const std::exception& e) {  // an answer that is not etcd's: this thread must not end the agent
      set_lost(lost_text(std::string("renewing this agent's lease: ") + e.what()));
      return;
    }
  }
}

int EtcdRendezvous::first_round() {
  const auto open = retry([&] { return etcd_->get(prefix_ + "open"); });
  return open ? std::stoi(open->value) : 0;
}

bool EtcdRendezvous::enter(int round) {
  const Json me = {{"id", id_},           {"given_rank", o_.node_rank_given ? o_.node_rank : -1},
                   {"addr", local_addr_}, {"port", pick_free_port_any()},
                   {"name", hostname()}};
  for (;;) {
    const auto cur = retry([&] { return etcd_->get(round_key(round)); });
    Json state = cur ? Json::parse(cur->value) : Json{{"agents", Json::array()}};
    for (const Json& a : state["agents"])
      if (a["id"].get<int64_t>() == id_) return true;
    // Closed, or full (MAX agents in it: it closes at once): this agent waits in the next round.
    if (state.contains("closed") || static_cast<int>(state["agents"].size()) >= o_.nnodes) return false;
    state["agents"].push_back(me);
    if (retry([&] { return etcd_->put_if(round_key(round), cur ? cur->mod_revision : 0, state.dump()); })) return true;
    throw_if_signalled();
  }
}

void EtcdRendezvous::try_close(int round, Json state, int64_t mod_revision) {
  const std::set<int64_t> alive = retry([&] { return living(*etcd_, prefix_); });
  Json agents = Json::array();
  for (const Json& a : state["agents"])
    if (alive.count(a["id"].get<int64_t>())) agents.push_back(a);
  if (agents.size() < state["agents"].size()) {  // drop the agents that died while waiting, then look again
    state["agents"] = agents;
    retry([&] { return etcd_->put_if(round_key(round), mod_revision, state.dump()); });
    return;
  }
  std::vector<Json> order(agents.begin(), agents.end());
  if (static_cast<int>(order.size()) > o_.nnodes) order.resize(static_cast<size_t>(o_.nnodes));  // the first MAX
  std::sort(order.begin(), order.end(), [](const Json& x, const Json& y) { return x["id"] < y["id"]; });
  bool all_given = true;
  for (const Json& a : order) all_given = all_given && a["given_rank"].get<int>() >= 0;
  std::vector<RoundAgent> ra;
  for (size_t i = 0; i < order.size(); ++i) ra.push_back({order[i]["given_rank"].get<int>(), i == 0 && !all_given});
  std::vector<int> ranks;
  if (std::string err = assign_node_ranks(ra, ranks); !err.empty()) {
    state["closed"] = {{"error", "rendezvous round " + std::to_string(round) + ": " + err}};
  } else {
    Json by_id = Json::object();
    for (size_t i = 0; i < order.size(); ++i) {
      by_id[std::to_string(order[i]["id"].get<int64_t>())] = {{"rank", ranks[i]}, {"name", order[i]["name"]}};
      if (ranks[i] == 0)
        state["closed"] = {{"master_addr", order[i]["addr"]}, {"master_port", order[i]["port"]}};
    }
    state["closed"]["ranks"] = by_id;
    state["closed"]["nnodes"] = static_cast<int>(order.size());
  }
  retry([&] { return etcd_->put_if(round_key(round), mod_revision, state.dump()); });
}

void EtcdRendezvous::leave_round(int round) {
  for (int tries = 0; tries < 20; ++tries) {
    const auto cur = retry([&] { return etcd_->get(round_key(round)); });
    if (!cur) return;
    Json state = Json::parse(cur->value);
    if (state.contains("closed")) return;
    Json agents = Json::array();
    for (const Json& a : state["agents"])
      if (a["id"].get<int64_t>() != id_) agents.push_back(a);
    state["agents"] = agents;
    if (retry([&] { return etcd_->put_if(round_key(round), cur->mod_revision, state.dump()); })) return;
  }
}

Json EtcdRendezvous::await_close(int round, Clock::time_point start) {
  const RoundLimits limits{o_.min_nodes, o_.nnodes, o_.last_call_timeout, o_.join_timeout};
  Clock::time_point min_at{};
  bool min_reached = false;
  for (;;) {
    if (store_lost()) throw RendezvousError(lost_reason());
    const auto cur = retry([&] { return etcd_->get(round_key(round)); });
    const Json state = cur ? Json::parse(cur->value) : Json{{"agents", Json::array()}};
    if (state.contains("closed")) return state["closed"];
    if (const auto ended = retry([&] { return etcd_->get(prefix_ + "ended"); })) {
      const Json e = Json::parse(ended->value);
      leave_round(round);
      const std::string how = e.value("ok", false) ? "succeeded" : "failed";
      if (e.value("ok", false))
        throw RendezvousFinished("the job " + how + " in round " + std::to_string(e.value("round", 0)) +
                                 " while this node waited to join round " + std::to_string(round) + "; leaving");
      throw RendezvousError("the job " + how + " in round " + std::to_string(e.value("round", 0)) +
                            " while this node waited to join round " + std::to_string(round));
    }
    const int joined = static_cast<int>(state["agents"].size());
    if (joined >= o_.min_nodes && !min_reached) min_at = Clock::now();
    min_reached = joined >= o_.min_nodes;
    const RoundState rs = round_state(limits, joined, seconds_since(start),
                                      min_reached ? std::optional<double>(seconds_since(min_at)) : std::nullopt);
    if (rs == RoundState::kClose && cur) {
      try_close(round, state, cur->mod_revision);
      continue;  // closed by this agent or another one, or some agent left: look again
    }
    if (rs == RoundState::kTimedOut) {
      leave_round(round);
      throw RendezvousError("rendezvous round " + std::to_string(round) + " timed out: " + std::to_string(joined) +
                            " of " + std::to_string(o_.min_nodes) + " node(s) joined within join_timeout=" +
                            seconds_text(o_.join_timeout) + " at " + address());
    }
    throw_if_signalled();
    std::this_thread::sleep_for(kPoll);
  }
}

Round EtcdRendezvous::join(int round) {
  const auto start = Clock::now();
  for (;; ++round) {
    if (!enter(round)) {
      say("rendezvous round " + std::to_string(round) + " closed before this node joined; waiting for round " +
          std::to_string(round + 1));
      continue;
    }
    retry([&] { etcd_->put(prefix_ + "open", std::to_string(round)); });
    const Json closed = await_close(round, start);
    if (closed.contains("error")) throw RendezvousError(closed["error"].get<std::string>());
    const std::string me = std::to_string(id_);
    if (!closed["ranks"].contains(me)) {
      say("rendezvous round " + std::to_string(round) + " closed without this node; waiting for round " +
          std::to_string(round + 1));
      continue;
    }
    members_.clear();
    for (const auto& [id, m] : closed["ranks"].items())
      members_.push_back({std::stoll(id), m["rank"].get<int>(), m.value("name", std::string())});
    return Round{round, closed["ranks"][me]["rank"].get<int>(), closed["nnodes"].get<int>(),
                 closed["master_addr"].get<std::string>(), closed["master_port"].get<int>()};
  }
}

void EtcdRendezvous::record_failure(int round, const Failure& f) {
  Failure mine = f;
  mine.host = hostname();
  retry([&] { etcd_->put(sub_key(round, "failure", id_), mine.json().dump()); });
}

std::optional<Failure> EtcdRendezvous::failure(int round) {
  auto all = retry([&] { return etcd_->get_prefix(round_key(round) + "/failure/"); });
  std::sort(all.begin(), all.end(), [](const auto& x, const auto& y) { return x.second.mod_revision < y.second.mod_revision; });
  std::optional<Failure> first;
  for (const auto& [key, value] : all) {
    const Failure f = Failure::from(Json::parse(value.value));
    if (f.signal != 0) return f;
    if (!first) first = f;
  }
  return first;
}

void EtcdRendezvous::finish(int round, int) {
  try {
    retry([&] { etcd_->put(sub_key(round, "done", id_), "1"); });
    retry([&] { etcd_->put(prefix_ + "ended", Json{{"ok", true}, {"round", round}}.dump()); });
  } catch (const RendezvousError&) {
    // This node's workers succeeded; etcd gone now changes nothing for it.
  }
}

void EtcdRendezvous::leave(int round, int) {
  try {  // every agent that leaves ends the job (agent.h): agents waiting for another round need not wait
    retry([&] { etcd_->put(sub_key(round, "left", id_), "1"); });
    retry([&] { etcd_->put(prefix_ + "ended", Json{{"ok", false}, {"round", round}}.dump()); });
  } catch (const RendezvousError&) {
  }
}

std::string EtcdRendezvous::watch_once(int round, int nnodes) {
  const auto records = etcd_->get_prefix(round_key(round) + "/");
  std::set<int64_t> gone_ok;  // done or left: their leases may end
  for (const auto& [key, value] : records) {
    if (key == sub_key(round, "failure", id_)) {  // recorded for this node by another agent: its lease expired
      set_lost("this agent's etcd lease expired: it could not renew it within " + std::to_string(ttl_) +
               " s, and the other agents count this node lost");
      return lost_reason();
    }
    if (key.find("/failure/") != std::string::npos)
      return "round " + std::to_string(round) + " failed on another node: " + Failure::from(Json::parse(value.value)).line();
    gone_ok.insert(id_of(key));
  }
  const std::set<int64_t> alive = living(*etcd_, prefix_);
  for (const Member& m : members_) {
    if (alive.count(m.id) || gone_ok.count(m.id)) continue;
    Failure f;
    f.node = m.node_rank;
    f.exit_code = 1;
    f.signal = 9;  // counted as a kill: it is the failure that ends the round
    f.what = "was lost: its agent's etcd lease expired (the agent, or its host, is gone)";
    f.host = m.name;
    etcd_->put_if(sub_key(round, "failure", m.id), 0, f.json().dump());
    return "round " + std::to_string(round) + " lost node " + std::to_string(m.node_rank) + " (host " + m.name +
           "): its agent's etcd lease expired";
  }
  if (nnodes < o_.nnodes && round < o_.max_restarts) {
    const auto next = etcd_->get(round_key(round + 1));
    const size_t waiting = next ? Json::parse(next->value)["agents"].size() : 0;
    if (waiting > 0) return scale_up_reason(static_cast<int64_t>(waiting), round, nnodes);
  }
  return "";
}

}  // namespace tandem::run
