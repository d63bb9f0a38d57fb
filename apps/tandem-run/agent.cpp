// The multi-node agent's loop (see agent.h).
#include "agent.h"

#include <chrono>
#include <thread>

#include "console.h"
#include "rendezvous.h"
#include "token.h"

namespace tandem::run {
namespace {

// This node's failure as recorded for the others.
Failure failure_of(const GroupResult& g, int node_rank, bool final) {
  Failure f;
  f.node = node_rank;
  f.rank = g.failed_rank;
  f.exit_code = g.exit_code;
  f.signal = g.signal;
  f.what = g.what.empty() ? "ended with exit code " + std::to_string(g.exit_code) : g.what;
  f.final = final;
  return f;
}

// A rank that exited with an error may have failed on a connection broken by another node's rank that
// was killed: give that node's agent a second to record it first, so it is the one reported.
void wait_for_earlier_failure(Rendezvous& rdzv, int round) {
  for (int i = 0; i < 10 && !rdzv.failure(round); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

void announce(const Rendezvous& rdzv, const Round& r, const RunOptions& o) {
  say("rendezvous round " + std::to_string(r.round) + " at " + rdzv.address() + ": node rank " +
      std::to_string(r.node_rank) + " of " + std::to_string(r.nnodes) + " node(s), world size " +
      std::to_string(r.nnodes * o.nproc_per_node) + ", workers' store " + r.master_addr + ":" +
      std::to_string(r.master_port));
}

// Plays the rounds; returns the exit code.
int play(Rendezvous& rdzv, GroupSpec& spec) {
  const RunOptions o = spec.options;  // as given: spec.options takes each round's node rank and count
  spec.stop_reason = [&rdzv] { return rdzv.stop_reason(); };
  for (int round = rdzv.first_round();;) {
    const Round r = rdzv.join(round);
    round = r.round;
    announce(rdzv, r, o);
    spec.options.node_rank = r.node_rank;
    spec.options.nnodes = r.nnodes;
    spec.master_addr = r.master_addr;
    spec.master_port = r.master_port;
    rdzv.start_watch(round, r.nnodes);
    const GroupResult g = run_worker_group(spec, round);
    rdzv.stop_watch();
    switch (g.kind) {
      case GroupResult::Kind::kSucceeded:
        rdzv.finish(round, r.nnodes);
        return 0;
      case GroupResult::Kind::kInterrupted:
      case GroupResult::Kind::kSpawnFailed:
        try {  // tell the others, if the store can still be reached: this agent ends either way
          rdzv.record_failure(round, failure_of(g, r.node_rank, /*final=*/true));
          rdzv.leave(round, r.nnodes);
        } catch (const RendezvousError& e) {
          say(std::string("warning: ") + e.what());
        }
        return g.exit_code;
      case GroupResult::Kind::kWorkerFailed:
        if (g.signal == 0) wait_for_earlier_failure(rdzv, round);
        rdzv.record_failure(round, failure_of(g, r.node_rank, /*final=*/false));
        break;
      case GroupResult::Kind::kStopped:
        if (rdzv.store_lost()) return 1;  // the supervisor said why
        if (!rdzv.failure(round)) {       // a node waits to join: a new round takes it in
          say("restarting the worker group to take in the waiting node(s) (restart " + std::to_string(round + 1) +
              " of " + std::to_string(o.max_restarts) + ")");
          ++round;
          continue;
        }
        break;
    }
    const Failure f = rdzv.failure(round).value_or(failure_of(g, r.node_rank, false));
    if (f.final || round >= o.max_restarts) {
      rdzv.leave(round, r.nnodes);
      if (f.final)
        say("not restarting: " + f.line() + ", and that node's agent stopped");
      else
        say((o.max_restarts > 0 ? "giving up after " + std::to_string(o.max_restarts) + " restart(s): "
                                : std::string("the job failed: ")) +
            f.line());
      return f.exit_code;
    }
    say("restarting the worker group with the other nodes (restart " + std::to_string(round + 1) + " of " +
        std::to_string(o.max_restarts) + ") after " + f.line());
    ++round;
  }
}

}  // namespace

int run_agent(GroupSpec spec) {
  try {
    if (std::string token = store_token_env(spec.options); !token.empty()) spec.base_env.push_back(token);
    const std::unique_ptr<Rendezvous> rdzv = make_rendezvous(spec.options);
    say(std::string(rdzv->is_host() ? "serving" : "joining") + " the rendezvous at " + rdzv->address() + " (nodes " +
        std::to_string(spec.options.min_nodes) + ":" + std::to_string(spec.options.nnodes) + ", run id " +
        spec.options.run_id + ")");
    return play(*rdzv, spec);
  } catch (const RendezvousFinished& e) {
    say(e.what());
    return 0;
  } catch (const RendezvousInterrupted& e) {
    say("received signal " + std::to_string(e.signal) + " during the rendezvous; stopping");
    return 128 + e.signal;
  } catch (const RendezvousError& e) {
    say(std::string("error: ") + e.what());
    return 1;
  }
}

}  // namespace tandem::run
