// tandem-run's command line, torchrun's spelling: both --nproc-per-node and
// --nproc_per_node are accepted, as torchrun does, and torch.distributed.launch's
// (--use_env is a no-op: the workers always get the environment, and nothing is ever
// appended to their command line, so they read LOCAL_RANK). --nproc-per-node takes a
// number, cpu, gpu or auto (GPUs if any, else CPUs), as torchrun's. Rendezvous:
// --rdzv-endpoint HOST[:PORT] is rank 0's store (MASTER_ADDR/MASTER_PORT), --rdzv-id the
// run id, --rdzv-backend c10d or static (both mean that store). The first positional
// argument is the PROGRAM; it and everything after it are the worker's command line.
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
  std::string run_id = "none";       // --rdzv-id: the workers' TORCHELASTIC_RUN_ID, as torchrun's
};

// Visible NVIDIA GPUs without the CUDA runtime: CUDA_VISIBLE_DEVICES when set ("-1" or empty: none;
// else its entries, at most the devices present), else the devices the driver lists under
// /proc/driver/nvidia/gpus (0 without a driver).
int visible_gpu_count();

// Parses argv into `o`. Returns -1 to go on, or the exit code to end with (0 after
// --help, 2 after a usage error, which it has printed).
int parse_options(int argc, char** argv, RunOptions& o);

}  // namespace tandem::run
