// tandem-run's command line, torchrun's spelling: both --nproc-per-node and
// --nproc_per_node are accepted, as torchrun does, and torch.distributed.launch's
// (--use_env is a no-op: the workers always get the environment, and nothing is ever
// appended to their command line, so they read LOCAL_RANK). --nproc-per-node takes a
// number, cpu, gpu or auto (GPUs if any, else CPUs), as torchrun's. Rendezvous:
// --rdzv-endpoint HOST[:PORT] is the same as --master-addr HOST --master-port PORT. With
// --nnodes 1 that is rank 0's store (the workers' MASTER_ADDR/MASTER_PORT); with --nnodes N > 1
// or MIN:MAX the agents meet there first (rendezvous.h) and node rank 0 picks the workers'
// port for each round. --rdzv-id is the run id (and the stores' token, token.h), --rdzv-backend c10d
// or static (both mean that store) or etcd / etcd-v2 (rendezvous.h; --rdzv-endpoint then lists the
// etcd members, HOST:PORT[,HOST:PORT...], and --local-addr is this node's address for the workers'
// store), --rdzv-conf KEY=VALUE,... the rendezvous' timeouts. The first positional
// argument is the PROGRAM; it and everything after it are the worker's command line.
#pragma once

#include <string>
#include <vector>

namespace tandem::run {

struct RunOptions {
  int nproc_per_node = 1;
  int nnodes = 1;        // the most nodes (MAX of --nnodes MIN:MAX)
  int min_nodes = 1;     // MIN of --nnodes MIN:MAX (= nnodes for a single number)
  int node_rank = 0;
  bool node_rank_given = false;  // --node-rank on the command line: keep it in every round
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;
  int max_restarts = 0;
  std::string log_dir;               // empty: forward output to the console, prefixed "[rank r] "
  double grace_seconds = 5.0;        // SIGTERM -> SIGKILL grace when ending workers
  std::vector<std::string> command;  // PROGRAM ARGS...
  std::string run_id = "none";       // --rdzv-id: the workers' TORCHELASTIC_RUN_ID, as torchrun's
  // --rdzv-conf (seconds): how long agents may take to form a round, the window for more agents once
  // MIN joined, and the bound on each call to the rendezvous store (and on being unable to reach it).
  double join_timeout = 600.0;
  double last_call_timeout = 2.0;
  double store_timeout = 60.0;
  std::string rdzv_backend = "c10d";        // c10d (static too) or etcd (etcd-v2 too)
  std::vector<std::string> etcd_endpoints;  // etcd: --rdzv-endpoint HOST:PORT[,HOST:PORT...]
  std::string local_addr;                   // --local-addr: this node's address for the others
  // Whether the agents meet in a rendezvous (every --nnodes but a plain 1; always with etcd).
  bool rendezvous() const { return nnodes > 1 || min_nodes != nnodes || rdzv_backend == "etcd"; }
};

// Visible NVIDIA GPUs without the CUDA runtime: CUDA_VISIBLE_DEVICES when set ("-1" or empty: none;
// else its entries, at most the devices present), else the devices the driver lists under
// /proc/driver/nvidia/gpus (0 without a driver).
int visible_gpu_count();

// Parses argv into `o`. Returns -1 to go on, or the exit code to end with (0 after
// --help, 2 after a usage error, which it has printed).
int parse_options(int argc, char** argv, RunOptions& o);

}  // namespace tandem::run
