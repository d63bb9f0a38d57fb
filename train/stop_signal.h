// A stop request from SIGTERM/SIGINT, polled by a training loop at iteration
// boundaries. install() sets handlers (SA_RESTART) that only record the first
// signal number in a lock-free atomic; nothing else runs in signal context.
// Process-wide; install once from the main thread before other threads start.
#pragma once

namespace tandem::train {

class StopSignal {
 public:
  static void install();     // SIGTERM and SIGINT
  static int requested();    // the signal received, 0 if none
  static void request(int sig);  // as if `sig` arrived (tests, and agreeing ranks)
  static void reset();
  // The exit code for a stop by `sig`: 128 + sig (143 for SIGTERM, 130 for SIGINT).
  static int exit_code(int sig) { return 128 + sig; }
};

}  // namespace tandem::train
