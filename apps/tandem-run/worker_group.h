// One node's worker group: spawns nproc_per_node copies of the program (fork +
// execve; each worker leads its own process group so that ending it also ends
// the processes it started), supervises them from the main thread, and ends the
// group when one fails. Assumes the calling thread has blocked SIGINT, SIGTERM,
// SIGHUP, SIGQUIT and SIGCHLD (main() does it before any thread starts): the
// supervisor takes them with sigtimedwait, so no signal handler runs.
// When several workers are found failed in one pass, the one killed by a signal (else the lowest
// rank) is reported and decides the exit code; the others are listed as "also ...".
// Guarantees: every worker it spawned has been reaped when run() returns, and
// each worker's process group has been sent SIGKILL unless all succeeded.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "options.h"

namespace tandem::run {

struct GroupResult {
  // kStopped: GroupSpec::stop_reason asked the group to end (another node's failure).
  enum class Kind { kSucceeded, kWorkerFailed, kInterrupted, kSpawnFailed, kStopped };
  Kind kind = Kind::kSucceeded;
  int exit_code = 0;     // what tandem-run should exit with
  int failed_rank = -1;  // kWorkerFailed / kSpawnFailed
  int signal = 0;        // kWorkerFailed: the signal that killed the rank, 0 when it exited
  std::string what;      // kWorkerFailed: "was killed by SIGKILL (exit code 137)", "failed with exit code 1"
};

// Everything needed to start the workers of one attempt.
struct GroupSpec {
  RunOptions options;
  std::string program_path;  // resolved PROGRAM (absolute or containing '/')
  std::string master_addr;
  int master_port = 0;
  std::vector<std::string> base_env;  // "KEY=VALUE" inherited by every worker
  // Polled by the supervisor every 50 ms while the workers run (must not block): a non-empty
  // answer is said once, and the workers are ended (SIGTERM, SIGKILL after the grace): kStopped.
  std::function<std::string()> stop_reason;
};

// Runs one attempt (0 = first) to completion.
GroupResult run_worker_group(const GroupSpec& spec, int attempt);

// The signals the supervisor takes (blocked in every thread, reset in workers).
void block_supervisor_signals();

// PROGRAM resolved like execvp: as given when it contains '/', else the first
// executable regular file on PATH. Returns "" when none is found.
std::string find_program(const std::string& program);

}  // namespace tandem::run
