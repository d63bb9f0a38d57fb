// Where this process sits in a distributed job, read from the variables its
// launcher set, as MMEngine's --launcher none|pytorch|slurm|mpi does:
//   none    one process: rank 0 of 1 (MASTER_ADDR / MASTER_PORT honoured when set).
//   pytorch torchrun / tandem-run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//           GROUP_RANK, MASTER_ADDR, MASTER_PORT (all required).
//   slurm   srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, tasks per
//           node from SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1") or
//           SLURM_NTASKS_PER_NODE; MASTER_ADDR from the environment or the first host
//           of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST; MASTER_PORT
//           from the environment or 29500.
//   mpi     Open MPI's mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
//           MASTER_ADDR from the environment, 127.0.0.1 when every rank is on one node;
//           MASTER_PORT from the environment or 29500.
// The environment is read through an injectable getter (getenv by default), so
// tests and embedders need not touch the process environment. Guarantees: the
// result is consistent (0 <= rank < world_size, 0 <= local_rank <
// local_world_size, 1 <= master_port <= 65535) or tandem::Error is thrown naming
// the launcher, the variable and what was expected.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"

namespace tandem::dist {

inline constexpr int kDefaultMasterPort = 29500;

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  std::string launcher = "none";
};

// Returns the value of an environment variable, or nullptr when it is unset.
using EnvGetter = std::function<const char*(const char*)>;

inline const char* process_getenv(const char* name) { return std::getenv(name); }

// Reads the job's layout for `launcher` (none, pytorch, slurm or mpi).
DistEnv env_from_launcher(const std::string& launcher, const EnvGetter& getenv = process_getenv);

// Expands Slurm's compressed host list: "node[01-04,07]" -> node01 node02 node03
// node04 node07; "a[1-2],b3" -> a1 a2 b3; "gpu-[001-003]x" -> gpu-001x ...; several
// bracket groups in one name expand as a product, left group outermost. Zero
// padding follows the width of a range's first bound. Throws on malformed lists.
std::vector<std::string> expand_nodelist(const std::string& nodelist);

// Expands Slurm's tasks-per-node form: "2(x3),1" -> 2 2 2 1. Throws when malformed.
std::vector<int> expand_tasks_per_node(const std::string& spec);

// The CUDA device this process should use: its local rank among the `visible_count` devices it
// can see (CUDA_VISIBLE_DEVICES already applied by the runtime), or device 0 when it sees exactly
// one device and CUDA_VISIBLE_DEVICES names exactly one (a launcher such as Slurm's
// --gpus-per-task=1 gave every task its own GPU). Throws when no device is visible, or when
// local_rank >= visible_count otherwise. `visible_devices` is CUDA_VISIBLE_DEVICES ("" if unset);
// the two-argument form reads it from the environment.
int cuda_device_for(int local_rank, int visible_count, const std::string& visible_devices);
int cuda_device_for(int local_rank, int visible_count);

// The device a process trains on, from --device's text: "auto" (a GPU when one is visible, else the
// CPU), "cpu", "cuda" (the local rank's GPU, by cuda_device_for, as "auto" picks it, so every rank
// of a launcher gets its own) or "cuda:N" (exactly that device, e.g. ranks sharing one GPU).
// Throws naming the text when it asks for CUDA that this build or machine lacks (`why_none`: why
// no device is visible, from tandem::cuda_unavailable_reason). The five-argument form is the
// rule; the two-argument form reads the machine and the environment.
Device resolve_device(const std::string& text, int local_rank, int visible_count,
                      const std::string& visible_devices, const std::string& why_none);
Device resolve_device(const std::string& text, int local_rank);

}  // namespace tandem::dist
