// tandem-run: torchrun-compatible launcher. Starts PROGRAM once per local rank
// with torchrun's variables, forwards output and SIGINT/SIGTERM, ends the group
// when a worker fails and exits with that worker's code (128+signal when a
// signal killed it), restarting the whole group up to --max-restarts times. With several nodes
// the agents meet in a rendezvous and restart together (agent.h).
// Its own messages are single lines on stderr starting "tandem-run: ".
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <string>

#include "agent.h"
#include "console.h"
#include "options.h"
#include "port.h"
#include "worker_group.h"

extern char** environ;

namespace {

constexpr const char* kOmpNotice =
    "OMP_NUM_THREADS is not set: setting it to 1 for each worker, to avoid your system being overloaded; "
    "please further tune the variable for optimal performance in your application as needed";

int run(int argc, char** argv) {
  using namespace tandem::run;
  RunOptions o;
  if (int code = parse_options(argc, argv, o); code >= 0) return code;
  block_supervisor_signals();  // before any thread exists, so every thread inherits the mask

  GroupSpec spec;
  spec.options = o;
  spec.program_path = find_program(o.command.front());
  if (spec.program_path.empty()) {
    say("error: PROGRAM '" + o.command.front() + "' not found on PATH");
    return 127;
  }
  spec.master_addr = o.master_addr;
  spec.master_port = o.master_port;
  if (o.standalone) {
    spec.master_addr = "127.0.0.1";
    spec.master_port = pick_free_port();
    say("--standalone: MASTER_ADDR=" + spec.master_addr + " MASTER_PORT=" + std::to_string(spec.master_port));
  }
  for (char** e = environ; *e; ++e) spec.base_env.emplace_back(*e);
  if (o.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    say(kOmpNotice);
    spec.base_env.emplace_back("OMP_NUM_THREADS=1");
  }
  if (!o.log_dir.empty()) say("worker output goes to " + o.log_dir + "/rank_<r>.log");
  if (o.rendezvous()) return run_agent(spec);

  for (int attempt = 0;; ++attempt) {
    if (o.node_rank == 0) {
      const PortCheck check = check_port_free(spec.master_addr, spec.master_port);
      if (!check.ok) {
        say("error: " + check.message);
        return 1;
      }
      if (attempt == 0 && !check.message.empty()) say("warning: " + check.message);
    }
    const GroupResult r = run_worker_group(spec, attempt);
    switch (r.kind) {
      case GroupResult::Kind::kSucceeded:
        return 0;
      case GroupResult::Kind::kInterrupted:
      case GroupResult::Kind::kSpawnFailed:
      case GroupResult::Kind::kStopped:  // no stop_reason on one node
        return r.exit_code;
      case GroupResult::Kind::kWorkerFailed:
        if (attempt >= o.max_restarts) {
          if (o.max_restarts > 0)
            say("giving up after " + std::to_string(o.max_restarts) + " restart(s): rank " +
                std::to_string(r.failed_rank) + " failed with exit code " + std::to_string(r.exit_code));
          return r.exit_code;
        }
        say("restarting the worker group (restart " + std::to_string(attempt + 1) + " of " +
            std::to_string(o.max_restarts) + ")");
        break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    tandem::run::say(std::string("error: ") + e.what());
    return 1;
  }
}
