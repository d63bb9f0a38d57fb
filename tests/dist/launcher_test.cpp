// tandem-run, driven as a user would: real launches (common/process.h) of small
// /bin/sh workers. Every launch is bounded (a launch still running after its limit
// is killed and the test fails); nothing here measures time. Each test works in its own
// temporary directory and on ports the kernel just handed out.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "common/test_util.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

const std::string kLauncher = TANDEM_BINARY_DIR "/apps/tandem-run";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

struct Launch {
  std::unique_ptr<Process> process;
  fs::path out, err;
  pid_t pid() const { return process->pid(); }
};

struct Result {
  int code = -1;  // exit code; 128+signal when killed; -1 when it had to be killed for running too long
  std::string out, err;
};

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kLauncher)) << kLauncher << " is missing; build the tandem-run target";
  }

  // Starts tandem-run ARGS with the test's environment changed by `set` ("K=V")
  // and `unset` (names); stdout/stderr go to files named after `tag`.
  Launch start(const std::vector<std::string>& args,
               const std::vector<std::string>& set = {"OMP_NUM_THREADS=2"},
               const std::vector<std::string>& unset = {}, const std::string& tag = "launch") {
    Launch l;
    l.out = dir_ / (tag + ".out");
    l.err = dir_ / (tag + ".err");
    std::vector<std::string> argv = {kLauncher};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env = unset;  // a bare name removes the variable
    env.insert(env.end(), set.begin(), set.end());
    l.process = std::make_unique<Process>(Spawn{.argv = argv, .env = env, .out = l.out, .err = l.err});
    return l;
  }

  // Waits for a launch to end, killing it after `limit`.
  Result finish(const Launch& l, std::chrono::seconds limit = std::chrono::seconds(45)) {
    Result r;
    r.code = l.process->finish(limit).value_or(-1);
    r.out = read_file(l.out);
    r.err = read_file(l.err);
    return r;
  }

  Result run(const std::vector<std::string>& args,
             const std::vector<std::string>& set = {"OMP_NUM_THREADS=2"},
             const std::vector<std::string>& unset = {},
             std::chrono::seconds limit = std::chrono::seconds(45)) {
    return finish(start(args, set, unset), limit);
  }

  // tandem-run options followed by a /bin/sh -c worker script.
  static std::vector<std::string> with_script(std::vector<std::string> options, const std::string& script) {
    options.insert(options.end(), {"/bin/sh", "-c", script});
    return options;
  }

  std::string path(const std::string& name) const { return dir_.file(name); }

  TempDir dir_{"launcher"};
};

TEST_F(LauncherTest, WorkersSeeTorchrunsVariables) {
  const std::string script =
      "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
      "$MASTER_PORT ${OMP_NUM_THREADS:-unset}\" > " +
      path("env_") + "$RANK";
  // Node 1 of 2, three workers per node; OMP_NUM_THREADS unset, so the launcher sets it to 1 (with a notice).
  // The agents meet at the rendezvous port; node 0 hands the workers a free port of its own.
  const int rdzv = free_port();
  auto node = [&](int rank) {
    return with_script({"--nproc-per-node", "3", "--nnodes", "2", "--node-rank", std::to_string(rank),
                        "--master-addr", "127.0.0.1", "--master-port", std::to_string(rdzv)},
                       script);
  };
  Launch node0 = start(node(0), {}, {"OMP_NUM_THREADS"}, "node0");
  Result r = run(node(1), {}, {"OMP_NUM_THREADS"});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(finish(node0).code, 0);
  const std::string env0 = read_file(path("env_0"));
  std::string workers_port;  // the 7th field: MASTER_PORT
  std::istringstream fields(env0);
  for (int i = 0; i < 7; ++i) fields >> workers_port;
  EXPECT_NE(workers_port, std::to_string(rdzv)) << env0;
  for (int rank = 0; rank < 6; ++rank)
    EXPECT_EQ(read_file(path("env_" + std::to_string(rank))),
              std::to_string(rank) + " " + std::to_string(rank % 3) + " 6 3 " + std::to_string(rank / 3) +
                  " 127.0.0.1 " + workers_port + " 1\n");
  int notices = 0;
  for (const std::string& line : lines(r.err)) notices += contains(line, "OMP_NUM_THREADS") ? 1 : 0;
  EXPECT_EQ(notices, 1) << r.err;

  // A user's OMP_NUM_THREADS is kept; one worker per node gets no default and no notice.
  const int port = free_port();
  r = run(with_script({"--nproc-per-node", "2", "--master-port", std::to_string(port)}, script),
          {"OMP_NUM_THREADS=4"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_file(path("env_1")), "1 1 2 2 0 127.0.0.1 " + std::to_string(port) + " 4\n");
  EXPECT_FALSE(contains(r.err, "OMP_NUM_THREADS")) << r.err;
  r = run(with_script({"--nproc_per_node=1", "--master_port", std::to_string(port)}, script), {},
          {"OMP_NUM_THREADS"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_file(path("env_0")), "0 0 1 1 0 127.0.0.1 " + std::to_string(port) + " unset\n");
  EXPECT_FALSE(contains(r.err, "OMP_NUM_THREADS")) << r.err;
}

TEST_F(LauncherTest, WorkersParseTheirEnvWithTheLibrary) {
  // This executable's DistEnvHelper.Worker (env_test.cpp) reads the variables with
  // env_from_launcher("pytorch").
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const int port = free_port();
  const Result r = run(
      {"--nproc-per-node", "2", "--master-port", std::to_string(port), self,
       "--gtest_filter=DistEnvHelper.Worker"},
      {"OMP_NUM_THREADS=1", "TANDEM_ENV_HELPER_LAUNCHER=pytorch", "TANDEM_ENV_HELPER_OUT=" + dir_.path().string()});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(read_file(path("pytorch_0")), "0 2 0 2 0 127.0.0.1 " + std::to_string(port) + "\n");
  EXPECT_EQ(read_file(path("pytorch_1")), "1 2 1 2 0 127.0.0.1 " + std::to_string(port) + "\n");
}

TEST_F(LauncherTest, FailingWorkerEndsTheGroupWithItsCode) {
  // Rank 0 sleeps for a minute; rank 1 waits until rank 0 is running, then exits 3.
  const std::string pid_file = path("pid0");
  const std::string script = "if [ $RANK = 0 ]; then echo $$ > " + pid_file + ".tmp; mv " + pid_file +
                             ".tmp " + pid_file + "; exec sleep 60; fi; i=0; while [ ! -e " + pid_file +
                             " ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit 3";
  const Result r =
      run(with_script({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())}, script),
          {"OMP_NUM_THREADS=1"}, {}, std::chrono::seconds(30));
  ASSERT_NE(r.code, -1) << "tandem-run did not end the sleeping worker";
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1")) << r.err;
  EXPECT_TRUE(contains(r.err, "exit code 3")) << r.err;
  ASSERT_TRUE(fs::exists(pid_file));
  const pid_t sleeper = std::stoi(read_file(pid_file));
  EXPECT_NE(::kill(sleeper, 0), 0) << "rank 0 (pid " << sleeper << ") still exists";
}

TEST_F(LauncherTest, SignalKilledWorkerGives128PlusSignal) {
  const std::string script = "if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 60";
  const Result r =
      run(with_script({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())}, script),
          {"OMP_NUM_THREADS=1"}, {}, std::chrono::seconds(30));
  EXPECT_EQ(r.code, 137) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1")) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGKILL")) << r.err;
}

TEST_F(LauncherTest, OutputIsForwardedWithRankPrefixes) {
  const std::string script = "echo out$RANK; echo err$RANK >&2; echo two words $RANK; printf tail$RANK";
  const Result r =
      run(with_script({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())}, script));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_TRUE(contains(r.out, "[rank " + rank + "] out" + rank + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, "[rank " + rank + "] two words " + rank + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, "[rank " + rank + "] tail" + rank + "\n"))
        << r.out;  // a last line without '\n'
    EXPECT_TRUE(contains(r.err, "[rank " + rank + "] err" + rank + "\n")) << r.err;
    EXPECT_FALSE(contains(r.out, "err" + rank)) << r.out;
  }
  const std::vector<std::string> out = lines(r.out);
  EXPECT_EQ(out.size(), 6u) << r.out;
  for (const std::string& line : out) EXPECT_EQ(line.rfind("[rank ", 0), 0u) << line;
}

TEST_F(LauncherTest, LogDirGetsOneFilePerRank) {
  const std::string logs = path("logs/nested");
  const std::string script = "echo out$RANK; echo err$RANK >&2";
  const Result r = run(with_script(
      {"--nproc-per-node", "2", "--log-dir", logs, "--master-port", std::to_string(free_port())}, script));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string rank : {"0", "1"}) {
    const std::string log = read_file(logs + "/rank_" + rank + ".log");
    EXPECT_EQ(log, "out" + rank + "\nerr" + rank + "\n");
  }
  EXPECT_FALSE(contains(r.out, "out0")) << r.out;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(LauncherTest, PortInUseIsOneClearError) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  const std::string port = std::to_string(ntohs(sa.sin_port));
  const Result r =
      run(with_script({"--nproc-per-node", "2", "--master-port", port}, "touch " + path("ran_") + "$RANK"));
  ::close(fd);
  EXPECT_EQ(r.code, 1);
  ASSERT_EQ(lines(r.err).size(), 1u) << r.err;
  EXPECT_TRUE(contains(r.err, "MASTER_PORT " + port + " on 127.0.0.1 is already in use")) << r.err;
  EXPECT_TRUE(contains(r.err, "--master-port")) << r.err;
  EXPECT_FALSE(fs::exists(path("ran_0")));
  EXPECT_FALSE(fs::exists(path("ran_1")));
}

TEST_F(LauncherTest, StandalonePicksAFreeLoopbackPort) {
  const std::string script = "echo \"$MASTER_ADDR $MASTER_PORT $WORLD_SIZE\" > " + path("addr_") + "$RANK";
  const Result r = run(with_script({"--standalone", "--nproc-per-node", "2"}, script));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string a0 = read_file(path("addr_0")), a1 = read_file(path("addr_1"));
  EXPECT_EQ(a0, a1);
  ASSERT_EQ(a0.rfind("127.0.0.1 ", 0), 0u) << a0;
  const int port = std::stoi(a0.substr(10));
  EXPECT_TRUE(port > 0 && port < 65536) << a0;
  EXPECT_TRUE(contains(r.err, "MASTER_PORT=" + std::to_string(port))) << r.err;
  EXPECT_TRUE(contains(a0, " 2\n"));

  const Result bad = run(with_script({"--standalone", "--nnodes", "2"}, "true"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.err, "--standalone")) << bad.err;
}

TEST_F(LauncherTest, MaxRestartsRestartsTheWholeGroup) {
  // Rank 0 fails on its first run only (a marker file remembers); every run is logged.
  const std::string marker = path("marker");
  const std::string script = "echo $TORCHELASTIC_RESTART_COUNT >> " + path("runs_") +
                             "$RANK; if [ $RANK = 0 ] && [ ! -e " + marker + " ]; then touch " + marker +
                             "; exit 4; fi; exit 0";
  const int port = free_port();
  Result r = run(with_script(
      {"--nproc-per-node", "2", "--max-restarts", "1", "--master-port", std::to_string(port)}, script));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_file(path("runs_0")), "0\n1\n");
  EXPECT_TRUE(contains(read_file(path("runs_1")), "1\n"));  // rank 1 ran again in the restarted group
  EXPECT_TRUE(contains(r.err, "restart 1 of 1")) << r.err;

  // A worker that always fails: one restart, then tandem-run gives up with its code.
  r = run(with_script({"--nproc-per-node", "1", "--max-restarts", "1", "--master-port", std::to_string(port)},
                      "echo x >> " + path("always") + "; exit 5"));
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_EQ(read_file(path("always")), "x\nx\n");
  EXPECT_TRUE(contains(r.err, "giving up")) << r.err;
}

TEST_F(LauncherTest, TwoJobsAtOnceOnDifferentPorts) {
  // Each job's rank 0 waits until the other job has started: both succeed only if they run together.
  auto script = [&](const std::string& me, const std::string& other) {
    return "if [ $RANK = 0 ]; then touch " + path("started_" + me) + "; i=0; while [ ! -e " +
           path("started_" + other) + " ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; [ -e " +
           path("started_" + other) + " ] || exit 9; fi; echo $MASTER_PORT > " + path("port_" + me + "_") +
           "$RANK";
  };
  const int port_a = free_port();
  int port_b = free_port();
  while (port_b == port_a) port_b = free_port();
  const Launch a =
      start(with_script({"--nproc-per-node", "2", "--master-port", std::to_string(port_a)}, script("a", "b")),
            {"OMP_NUM_THREADS=1"}, {}, "a");
  const Launch b =
      start(with_script({"--nproc-per-node", "2", "--master-port", std::to_string(port_b)}, script("b", "a")),
            {"OMP_NUM_THREADS=1"}, {}, "b");
  const Result ra = finish(a), rb = finish(b);
  EXPECT_EQ(ra.code, 0) << ra.err;
  EXPECT_EQ(rb.code, 0) << rb.err;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_EQ(read_file(path("port_a_" + rank)), std::to_string(port_a) + "\n");
    EXPECT_EQ(read_file(path("port_b_" + rank)), std::to_string(port_b) + "\n");
  }
}

TEST_F(LauncherTest, ForwardsSigtermToTheWorkers) {
  const std::string script = "trap 'echo term > " + path("term_") + "$RANK; exit 0' TERM; touch " +
                             path("ready_") + "$RANK; while :; do sleep 0.05; done";
  const Launch l =
      start(with_script({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())}, script));
  ASSERT_TRUE(eventually([&] { return fs::exists(path("ready_0")) && fs::exists(path("ready_1")); }))
      << read_file(l.err);
  ::kill(l.pid(), SIGTERM);
  const Result r = finish(l);
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGTERM")) << r.err;
  EXPECT_EQ(read_file(path("term_0")), "term\n");
  EXPECT_EQ(read_file(path("term_1")), "term\n");
}

TEST_F(LauncherTest, UsageErrors) {
  Result r = run({"--nproc-per-node", "2"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "no PROGRAM")) << r.err;
  r = run({"--nproc-per-node", "zero", "true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--nproc-per-node")) << r.err;
  r = run({"--nnodes", "4:1", "true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "expected N or MIN:MAX with 1 <= MIN <= MAX")) << r.err;
  r = run({"--nnodes", "1:4", "--node-rank", "1", "true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "numbers its nodes by arrival")) << r.err;
  r = run({"--nnodes", "2", "--rdzv-conf", "join_timeout=soon", "true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "expected join_timeout=SECONDS")) << r.err;
  r = run({"--nnodes", "2", "--rdzv-conf", "patience=3", "true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "unknown key 'patience'")) << r.err;
  r = run({"--nnodes", "2", "--node-rank", "2", "true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--node-rank")) << r.err;
  r = run({"--master-port", std::to_string(free_port()), "tandem-no-such-program-xyz"});
  EXPECT_EQ(r.code, 127);
  EXPECT_TRUE(contains(r.err, "tandem-no-such-program-xyz")) << r.err;
  EXPECT_TRUE(contains(r.err, "not found on PATH")) << r.err;
  // PATH is searched for the program; arguments after it are the worker's, even when they look like options.
  r = run({"--master-port", std::to_string(free_port()), "--", "sh", "-c", "echo $0 $1", "zero",
           "--nproc-per-node"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] zero --nproc-per-node\n");
}

}  // namespace

// python -m torch.distributed.launch / torchrun command lines with tandem-run in their place.
TEST_F(LauncherTest, TorchDistributedLaunchAndTorchrunSpellingsWork) {
  const std::string script = "echo \"$LOCAL_RANK $MASTER_ADDR $MASTER_PORT $TORCHELASTIC_RUN_ID $#\" > " +
                             path("launch_") + "$RANK";
  const int port = free_port();
  // torch.distributed.launch --use_env: a no-op here; nothing (no --local_rank) is appended.
  Result r = run(with_script({"--use_env", "--nproc_per_node=2", "--master_port", std::to_string(port)}, script));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_file(path("launch_1")), "1 127.0.0.1 " + std::to_string(port) + " none 0\n");
  // torchrun's rendezvous flags: the endpoint is rank 0's store, the id reaches the workers.
  r = run(with_script({"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port),
                       "--rdzv-id", "job7", "--nproc-per-node", "1"},
                      script));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_file(path("launch_0")), "0 127.0.0.1 " + std::to_string(port) + " job7 0\n");
  // auto without a visible GPU: one worker per CPU core.
  r = run(with_script({"--nproc-per-node", "auto", "--master-port", std::to_string(port)},
                      "echo $LOCAL_WORLD_SIZE > " + path("auto")),
          {"OMP_NUM_THREADS=1", "CUDA_VISIBLE_DEVICES=-1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_file(path("auto")), std::to_string(std::max(1u, std::thread::hardware_concurrency())) + "\n");
}

TEST_F(LauncherTest, UnsupportedRendezvousAndNoGpuForGpuWorkersAreUsageErrors) {
  Result r = run(with_script({"--nproc-per-node", "gpu"}, "true"), {"CUDA_VISIBLE_DEVICES=-1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--nproc-per-node gpu: no GPU is visible")) << r.err;
  r = run(with_script({"--rdzv-backend", "zookeeper"}, "true"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--rdzv-backend zookeeper: expected c10d or static (a TCP store served by one agent), "
                              "or etcd / etcd-v2")) << r.err;
  r = run(with_script({"--rdzv-backend", "etcd"}, "true"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...]")) << r.err;
  r = run(with_script({"--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "10.0.0.1:2379,10.0.0.2"}, "true"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "'10.0.0.2' is not HOST:PORT of an etcd member")) << r.err;
  r = run(with_script({"--rdzv-endpoint", "host:notaport"}, "true"));
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "expected HOST[:PORT]")) << r.err;
}

// --rdzv-backend etcd with no etcd at the endpoints: the agent ends within --rdzv-conf timeout, exit
// code 1, naming every endpoint and what to check.
TEST_F(LauncherTest, AnUnreachableEtcdEndsTheAgentNamingTheEndpoints) {
  const std::string a = "127.0.0.1:" + std::to_string(free_port()), b = "127.0.0.1:" + std::to_string(free_port());
  const Result r = run(with_script({"--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", a + "," + b,
                                    "--rdzv-id", "job", "--rdzv-conf", "timeout=1"},
                                   "true"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "tandem-run: error: the etcd rendezvous at etcd://" + a + "," + b +
                                  " could not be used for 1 s (timeout): no etcd member reachable at http://" + a +
                                  ",http://" + b))
      << r.err;
  EXPECT_TRUE(contains(r.err, "is etcd running there, and is --rdzv-endpoint right?")) << r.err;
}
