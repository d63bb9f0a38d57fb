// tandem-run's command line, torchrun's spelling: both --nproc-per-node and
// --nproc_per_node are accepted, as torchrun does. The first positional argument
// is the PROGRAM; it and everything after it are the worker's command line.
#pragma once

#include <string>
#include <vector>

namespace tandem::run {

struct RunOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;
  int max_restarts = 0;
  std::string log_dir;               // empty: forward output to the console, prefixed "[rank r] "
  double grace_seconds = 5.0;        // SIGTERM -> SIGKILL grace when ending workers
  std::vector<std::string> command;  // PROGRAM ARGS...
};

// Parses argv into `o`. Returns -1 to go on, or the exit code to end with (0 after
// --help, 2 after a usage error, which it has printed).
int parse_options(int argc, char** argv, RunOptions& o);

}  // namespace tandem::run
