// dist/env: every launcher's parse path through an injected environment (the
// process environment is never touched), Slurm's node-list and tasks-per-node
// forms, and the errors, which must name the launcher and the variable. One
// real 2-rank launch under Debian's Open MPI mpirun (skipped where mpirun is
// missing, started by common/process.h) runs this executable's DistEnvHelper.Worker
// as the ranks.
#include "dist/store/env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "common/process.h"
#include "common/test_util.h"
#include "core/error.h"

using namespace tandem;
using tandem::test::Process;
using tandem::test::read_file;
using tandem::test::Spawn;
using tandem::test::TempDir;
using dist::DistEnv;
using dist::env_from_launcher;
using dist::expand_nodelist;
using dist::expand_tasks_per_node;

namespace {

using Vars = std::map<std::string, std::string>;

dist::EnvGetter getter(const Vars& vars) {
  return [&vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

DistEnv parse(const std::string& launcher, const Vars& vars) {
  return env_from_launcher(launcher, getter(vars));
}

// Expects an Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

const Vars kTorchrun = {
    {"RANK", "5"},       {"WORLD_SIZE", "8"},         {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "4"},
    {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"}};

const Vars kSlurm = {{"SLURM_PROCID", "6"},
                     {"SLURM_NTASKS", "7"},
                     {"SLURM_LOCALID", "0"},
                     {"SLURM_NODEID", "3"},
                     {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                     {"SLURM_JOB_NODELIST", "node[01-04,07]"}};

const Vars kMpi = {{"OMPI_COMM_WORLD_RANK", "3"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};

}  // namespace

TEST(DistEnv, NoneIsOneProcess) {
  DistEnv d = parse("none", {});
  EXPECT_EQ(d.launcher, "none");
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.local_rank, 0);
  EXPECT_EQ(d.local_world_size, 1);
  EXPECT_EQ(d.node_rank, 0);
  EXPECT_EQ(d.master_addr, "127.0.0.1");
  EXPECT_EQ(d.master_port, 29500);
  // It ignores the other launchers' variables, but honours MASTER_ADDR / MASTER_PORT.
  d = parse("none", {{"RANK", "3"}, {"MASTER_ADDR", "host1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.master_addr, "host1");
  EXPECT_EQ(d.master_port, 1234);
  expect_error([] { parse("none", {{"MASTER_PORT", "http"}}); }, {"'none'", "MASTER_PORT", "http"});
}

TEST(DistEnv, Torchrun) {
  const DistEnv d = parse("pytorch", kTorchrun);
  EXPECT_EQ(d.launcher, "pytorch");
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world_size, 8);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 4);
  EXPECT_EQ(d.node_rank, 1);
  EXPECT_EQ(d.master_addr, "10.0.0.1");
  EXPECT_EQ(d.master_port, 29400);
}

TEST(DistEnv, TorchrunErrorsNameTheVariable) {
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    Vars v = kTorchrun;
    v.erase(name);
    expect_error([&] { parse("pytorch", v); }, {"'pytorch'", name, "not set"});
    v[name] = "";  // empty counts as unset
    expect_error([&] { parse("pytorch", v); }, {"'pytorch'", name, "not set"});
  }
  for (const char* bad : {"abc", "1x", "2.5", "0x10", "99999999999"}) {
    Vars v = kTorchrun;
    v["RANK"] = bad;
    expect_error([&] { parse("pytorch", v); }, {"'pytorch'", "RANK"});
  }
  Vars v = kTorchrun;
  v["RANK"] = "8";
  expect_error([&] { parse("pytorch", v); }, {"RANK=8", "WORLD_SIZE=8"});
  v = kTorchrun;
  v["LOCAL_RANK"] = "4";
  expect_error([&] { parse("pytorch", v); }, {"LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4"});
  v = kTorchrun;
  v["WORLD_SIZE"] = "0";
  expect_error([&] { parse("pytorch", v); }, {"WORLD_SIZE=0", "out of range"});
  v = kTorchrun;
  v["MASTER_PORT"] = "70000";
  expect_error([&] { parse("pytorch", v); }, {"MASTER_PORT=70000", "65535"});
  v = kTorchrun;
  v["RANK"] = "-1";
  expect_error([&] { parse("pytorch", v); }, {"RANK=-1"});
  v = kTorchrun;
  v["RANK"] = " 5 ";  // blanks around a number are tolerated
  EXPECT_EQ(parse("pytorch", v).rank, 5);
}

TEST(DistEnv, Slurm) {
  DistEnv d = parse("slurm", kSlurm);
  EXPECT_EQ(d.launcher, "slurm");
  EXPECT_EQ(d.rank, 6);
  EXPECT_EQ(d.world_size, 7);
  EXPECT_EQ(d.local_rank, 0);
  EXPECT_EQ(d.node_rank, 3);
  EXPECT_EQ(d.local_world_size, 1);  // the 4th node of "2(x3),1"
  EXPECT_EQ(d.master_addr, "node01");
  EXPECT_EQ(d.master_port, 29500);

  Vars v = kSlurm;
  v["SLURM_PROCID"] = "3";
  v["SLURM_LOCALID"] = "1";
  v["SLURM_NODEID"] = "1";
  d = parse("slurm", v);
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.local_rank, 1);

  // The step's lists win over the job's; MASTER_ADDR / MASTER_PORT from the environment win over both.
  v = kSlurm;
  v["SLURM_STEP_NODELIST"] = "gpu-[003-004]x";
  v["SLURM_STEP_TASKS_PER_NODE"] = "1(x3),3";
  d = parse("slurm", v);
  EXPECT_EQ(d.master_addr, "gpu-003x");
  EXPECT_EQ(d.local_world_size, 3);
  v["MASTER_ADDR"] = "login7";
  v["MASTER_PORT"] = "31000";
  d = parse("slurm", v);
  EXPECT_EQ(d.master_addr, "login7");
  EXPECT_EQ(d.master_port, 31000);

  // SLURM_NODELIST (older Slurm) and SLURM_NTASKS_PER_NODE as fallbacks.
  v = kSlurm;
  v.erase("SLURM_JOB_NODELIST");
  v.erase("SLURM_TASKS_PER_NODE");
  v["SLURM_NODELIST"] = "a[1-2],b3";
  v["SLURM_NTASKS_PER_NODE"] = "2";
  d = parse("slurm", v);
  EXPECT_EQ(d.master_addr, "a1");
  EXPECT_EQ(d.local_world_size, 2);
}

TEST(DistEnv, SlurmErrors) {
  for (const char* name : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID"}) {
    Vars v = kSlurm;
    v.erase(name);
    expect_error([&] { parse("slurm", v); }, {"'slurm'", name, "not set", "srun"});
    v[name] = "x1";
    expect_error([&] { parse("slurm", v); }, {"'slurm'", name, "x1", "not an integer"});
  }
  Vars v = kSlurm;
  v.erase("SLURM_TASKS_PER_NODE");
  expect_error([&] { parse("slurm", v); }, {"'slurm'", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"});
  v = kSlurm;
  v["SLURM_TASKS_PER_NODE"] = "2(x3";
  expect_error([&] { parse("slurm", v); }, {"'slurm'", "SLURM_TASKS_PER_NODE", "2(x3", "malformed"});
  v = kSlurm;
  v["SLURM_TASKS_PER_NODE"] = "2(x3)";  // only 3 nodes, but SLURM_NODEID=3
  expect_error([&] { parse("slurm", v); }, {"SLURM_NODEID=3", "SLURM_TASKS_PER_NODE"});
  v = kSlurm;
  v["SLURM_LOCALID"] = "1";  // node 3 runs one task
  expect_error([&] { parse("slurm", v); }, {"SLURM_LOCALID=1", "tasks per node"});
  v = kSlurm;
  v["SLURM_JOB_NODELIST"] = "node[01-04";
  expect_error([&] { parse("slurm", v); }, {"'slurm'", "SLURM_JOB_NODELIST", "node[01-04"});
  v = kSlurm;
  v.erase("SLURM_JOB_NODELIST");
  expect_error([&] { parse("slurm", v); }, {"'slurm'", "MASTER_ADDR", "SLURM_JOB_NODELIST"});
  v = kSlurm;
  v["MASTER_PORT"] = "0";
  expect_error([&] { parse("slurm", v); }, {"'slurm'", "MASTER_PORT=0"});
}

TEST(DistEnv, OpenMpi) {
  DistEnv d = parse("mpi", kMpi);
  EXPECT_EQ(d.launcher, "mpi");
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.local_rank, 3);
  EXPECT_EQ(d.local_world_size, 4);
  EXPECT_EQ(d.node_rank, 0);
  EXPECT_EQ(d.master_addr, "127.0.0.1");  // all ranks on one node
  EXPECT_EQ(d.master_port, 29500);

  Vars v = kMpi;
  v["OMPI_COMM_WORLD_RANK"] = "5";
  v["OMPI_COMM_WORLD_SIZE"] = "8";
  v["OMPI_COMM_WORLD_LOCAL_RANK"] = "1";
  expect_error([&] { parse("mpi", v); }, {"'mpi'", "MASTER_ADDR", "several nodes", "-x MASTER_ADDR"});
  v["MASTER_ADDR"] = "node0";
  v["MASTER_PORT"] = "29999";
  d = parse("mpi", v);
  EXPECT_EQ(d.master_addr, "node0");
  EXPECT_EQ(d.master_port, 29999);
  EXPECT_EQ(d.node_rank, 1);
}

TEST(DistEnv, OpenMpiErrors) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    Vars v = kMpi;
    v.erase(name);
    expect_error([&] { parse("mpi", v); }, {"'mpi'", name, "not set", "mpirun"});
    v[name] = "four";
    expect_error([&] { parse("mpi", v); }, {"'mpi'", name, "four"});
  }
  Vars v = kMpi;
  v["OMPI_COMM_WORLD_LOCAL_SIZE"] = "8";
  expect_error([&] { parse("mpi", v); }, {"OMPI_COMM_WORLD_LOCAL_SIZE=8", "OMPI_COMM_WORLD_SIZE=4"});
}

TEST(DistEnv, UnknownLauncher) {
  expect_error([] { parse("torchrun", kTorchrun); }, {"torchrun", "none, pytorch, slurm or mpi"});
}

TEST(DistEnv, ProcessEnvironmentByDefault) {
  // With no getter the process environment is read; "none" needs nothing from it.
  const DistEnv d = env_from_launcher("none");
  EXPECT_EQ(d.world_size, 1);
}

TEST(Nodelist, Forms) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_nodelist("node[01-04,07]"), (V{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand_nodelist("a[1-2],b3"), (V{"a1", "a2", "b3"}));
  EXPECT_EQ(expand_nodelist("gpu-[001-003]x"), (V{"gpu-001x", "gpu-002x", "gpu-003x"}));
  EXPECT_EQ(expand_nodelist("login1"), (V{"login1"}));
  EXPECT_EQ(expand_nodelist("a,b,c"), (V{"a", "b", "c"}));
  EXPECT_EQ(expand_nodelist("n[8-10]"), (V{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_nodelist("n[08-10]"), (V{"n08", "n09", "n10"}));
  EXPECT_EQ(expand_nodelist("n[7]"), (V{"n7"}));
  EXPECT_EQ(expand_nodelist("r[1-2]n[1-2]"), (V{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(expand_nodelist("x[1,3],y[09-11],z"), (V{"x1", "x3", "y09", "y10", "y11", "z"}));
  EXPECT_EQ(expand_nodelist("host-1.cluster.org"), (V{"host-1.cluster.org"}));
  EXPECT_EQ(expand_nodelist(" node[1-2]\n"), (V{"node1", "node2"}));
  EXPECT_EQ(expand_nodelist("c[1-1000]").size(), 1000u);
  EXPECT_EQ(expand_nodelist("c[1-1000]").back(), "c1000");
}

TEST(Nodelist, Errors) {
  expect_error([] { expand_nodelist(""); }, {"empty"});
  expect_error([] { expand_nodelist("node[1-"); }, {"node[1-", "'['"});
  expect_error([] { expand_nodelist("node1]"); }, {"node1]"});
  expect_error([] { expand_nodelist("node[]"); }, {"node[]", "empty range"});
  expect_error([] { expand_nodelist("node[3-1]"); }, {"3-1", "backwards"});
  expect_error([] { expand_nodelist("node[a-b]"); }, {"a-b", "not a number"});
  expect_error([] { expand_nodelist("node[1-2-3]"); }, {"1-2-3"});
  expect_error([] { expand_nodelist("a,,b"); }, {"a,,b", "empty host"});
  expect_error([] { expand_nodelist("a,"); }, {"empty host"});
  expect_error([] { expand_nodelist("n[[1]]"); }, {"n[[1]]"});
  expect_error([] { expand_nodelist("n[1,]"); }, {"empty range"});
  expect_error([] { expand_nodelist("a b"); }, {"blanks"});
  expect_error([] { expand_nodelist("n[0-99999999]"); }, {"more than"});
}

TEST(TasksPerNode, Forms) {
  EXPECT_EQ(expand_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_tasks_per_node("1,2,3"), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(expand_tasks_per_node("8(x2)"), (std::vector<int>{8, 8}));
  for (const char* bad : {"", "x", "2(x)", "2(3)", "2(x3", "2,", ",2", "0", "2 (x3)", "-1"})
    EXPECT_THROW(expand_tasks_per_node(bad), Error) << "'" << bad << "'";
}

TEST(CudaDevice, LocalRankAmongVisibleDevices) {
  EXPECT_EQ(dist::cuda_device_for(0, 1), 0);
  EXPECT_EQ(dist::cuda_device_for(1, 2), 1);
  EXPECT_EQ(dist::cuda_device_for(3, 8), 3);
  expect_error([] { dist::cuda_device_for(2, 2); }, {"local rank 2", "2 device(s)", "CUDA_VISIBLE_DEVICES"});
  expect_error([] { dist::cuda_device_for(0, 0); }, {"no CUDA device", "CUDA_VISIBLE_DEVICES"});
  EXPECT_THROW(dist::cuda_device_for(-1, 2), Error);
}

TEST(CudaDevice, OneGpuNamedPerTaskServesAnyLocalRank) {
  // srun --gpus-per-task=1: every task sees exactly its own GPU, whatever its local rank.
  EXPECT_EQ(dist::cuda_device_for(1, 1, "3"), 0);
  EXPECT_EQ(dist::cuda_device_for(5, 1, "GPU-8f2c"), 0);
  // One device visible but not named alone for this process: a second rank would share it silently.
  expect_error([] { dist::cuda_device_for(1, 1, ""); }, {"local rank 1", "1 device(s)", "<unset>"});
  expect_error([] { dist::cuda_device_for(2, 2, "0,1"); }, {"local rank 2", "CUDA_VISIBLE_DEVICES=0,1"});
}

TEST(CudaDevice, DeviceFlagMapsCudaToTheLocalRank) {
  const std::string none_why = "cudaErrorInsufficientDriver: CUDA driver version is insufficient";
  // --device cuda under a launcher: each rank its own GPU, as auto picks it.
  EXPECT_EQ(dist::resolve_device("cuda", 1, 2, "", ""), Device::cuda(1));
  EXPECT_EQ(dist::resolve_device("cuda", 0, 2, "", ""), Device::cuda(0));
  EXPECT_EQ(dist::resolve_device("auto", 1, 2, "", ""), Device::cuda(1));
  EXPECT_EQ(dist::resolve_device("cuda", 3, 1, "2", ""), Device::cuda(0));
  // An explicit index is kept (ranks sharing one GPU on purpose).
  EXPECT_EQ(dist::resolve_device("cuda:0", 1, 1, "", ""), Device::cuda(0));
  EXPECT_EQ(dist::resolve_device("cuda:1", 0, 2, "", ""), Device::cuda(1));
  EXPECT_EQ(dist::resolve_device("cpu", 1, 2, "", ""), Device::cpu());
  EXPECT_EQ(dist::resolve_device("auto", 1, 0, "", none_why), Device::cpu());
  // Asking for CUDA where none is visible names the runtime's reason.
  expect_error([&] { dist::resolve_device("cuda", 0, 0, "", none_why); },
               {"--device cuda", "no CUDA device", "cudaErrorInsufficientDriver"});
  expect_error([] { dist::resolve_device("cuda:2", 0, 2, "", ""); }, {"--device cuda:2", "only 2"});
  expect_error([] { dist::resolve_device("cuda", 2, 2, "", ""); }, {"local rank 2"});
  expect_error([] { dist::resolve_device("gpu", 0, 1, "", ""); }, {"gpu", "cpu, cuda or cuda:N"});
}

// Not a test on its own: the worker that real launches (mpirun here, tandem-run
// in launcher_test.cpp) start. It parses its environment for the launcher named
// in TANDEM_ENV_HELPER_LAUNCHER and writes what it found to
// $TANDEM_ENV_HELPER_OUT/<launcher>_<rank>.
TEST(DistEnvHelper, Worker) {
  const char* launcher = std::getenv("TANDEM_ENV_HELPER_LAUNCHER");
  const char* out = std::getenv("TANDEM_ENV_HELPER_OUT");
  if (!launcher || !out)
    GTEST_SKIP() << "helper for DistEnv.MpirunLaunch and LauncherTest.WorkersParseTheirEnv";
  const DistEnv d = env_from_launcher(launcher);
  std::ofstream f(std::string(out) + "/" + launcher + "_" + std::to_string(d.rank));
  f << d.rank << " " << d.world_size << " " << d.local_rank << " " << d.local_world_size << " " << d.node_rank
    << " " << d.master_addr << " " << d.master_port << "\n";
  ASSERT_TRUE(f.good());
}

TEST(DistEnv, MpirunLaunch) {
  const std::string mpirun = "/usr/bin/mpirun";
  if (::access(mpirun.c_str(), X_OK) != 0) GTEST_SKIP() << "Open MPI's mpirun is not installed";
  TempDir dir("mpi");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();

  // Environment: ours without MASTER_*, plus the helper's switches and Open MPI's consent to run as root.
  const std::vector<std::string> env = {"MASTER_ADDR",
                                        "MASTER_PORT",
                                        "TANDEM_ENV_HELPER_LAUNCHER=mpi",
                                        "TANDEM_ENV_HELPER_OUT=" + dir.path().string(),
                                        "OMPI_ALLOW_RUN_AS_ROOT=1",
                                        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                        "OMPI_MCA_rmaps_base_oversubscribe=1"};
  const std::filesystem::path log = dir / "mpirun.log";
  // Bounded wait: after 60 s mpirun is killed and the test fails.
  const std::optional<int> rc =
      Process(Spawn{.argv = {mpirun, "-np", "2", self, "--gtest_filter=DistEnvHelper.Worker"}, .env = env, .out = log})
          .finish(std::chrono::seconds(60));
  const std::string output = read_file(log);
  EXPECT_TRUE(rc.has_value()) << "mpirun still running after 60 s\n" << output;
  EXPECT_TRUE(rc == 0) << output;
  EXPECT_EQ(read_file(dir / "mpi_0"), "0 2 0 2 0 127.0.0.1 29500\n") << output;
  EXPECT_EQ(read_file(dir / "mpi_1"), "1 2 1 2 0 127.0.0.1 29500\n") << output;
}
