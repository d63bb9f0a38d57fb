// The test harness's processes: the one way a test starts a program or forks a child, and the one
// bounded wait on them (common/ranks.h builds the multi-rank runs on top of it).
// Owns: spawning (posix_spawn of an argv with changes to the inherited environment, stdout and
//   stderr to files, an optional working directory and an optional new process group); forking a
//   child that runs a function of this test binary and _exits with its result (fork_children
//   starts n of them together); waiting for them; run_process, the run-to-the-end form.
// Guarantees: no wait here blocks past its limit; a process still running when a finishing wait
//   (finish, wait_all, run_process) reaches its limit, or when its Process is destroyed, is killed
//   with SIGKILL (its whole process group when it leads one) and reaped, so a test can neither
//   hang on a child nor leave one behind. An exit status is the exit code, 128 + the signal when a
//   signal ended the process, -1 when it never started. The limits bound waits; nothing here
//   measures time for a result.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tandem::test {

using std::chrono::milliseconds;
using std::chrono::seconds;

// What to start. `env` changes the inherited environment: "K=V" sets K, a bare "K" removes it.
// `out` receives stdout, and stderr too unless `err` names a file of its own; an empty `out`
// leaves stdout inherited (and stderr, unless `err` is given).
struct Spawn {
  std::vector<std::string> argv;  // argv[0] is the program's path (PATH is not searched)
  std::vector<std::string> env = {};
  std::filesystem::path out = {};
  std::filesystem::path err = {};
  std::filesystem::path cwd = {};  // empty: this process's
  bool own_group = false;          // lead a new process group, killed as a whole
};

class Process {
 public:
  Process() = default;  // no process
  explicit Process(const Spawn& spec);
  // A program with stdout+stderr in `log`, leading its own process group; `env` as in Spawn.
  Process(const std::vector<std::string>& argv, const std::filesystem::path& log,
          const std::vector<std::string>& env = {});
  // A child of this test binary that runs body() and ends with _exit(its result): it never
  // returns into the test runner, and no destructor runs there. An exception escaping body is
  // printed to stderr and ends the child with 3.
  static Process fork(const std::function<int()>& body);

  ~Process();  // kills a process still running (with its group) and reaps it
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  // The exit status once the process has ended and been reaped (by a wait or running()).
  std::optional<int> status() const { return status_; }
  // Whether a finishing wait killed it for outliving its limit.
  bool timed_out() const { return timed_out_; }
  // The whole of what it wrote to `out` (or `log`) so far.
  std::string output() const;

  // Whether it still runs; reaps it when it has ended.
  bool running();
  // The exit status once it ends, or nullopt when it still runs after `limit` (it keeps running).
  std::optional<int> wait_for(milliseconds limit);
  // The same, but a process still running after `limit` is killed and reaped: nullopt says so.
  std::optional<int> finish(milliseconds limit);
  // True once `needle` is in output(), false after `limit` or when it ended without writing it.
  bool wait_for_text(const std::string& needle, milliseconds limit);

 private:
  friend bool wait_all(std::vector<Process>& procs, milliseconds limit);
  static bool finish_all(const std::vector<Process*>& procs, milliseconds limit);
  void kill_and_reap();

  pid_t pid_ = -1;
  bool own_group_ = false;
  bool timed_out_ = false;
  std::filesystem::path out_;
  std::optional<int> status_;
};

// n children of this test binary, child i running body(i) as Process::fork runs its body. They
// start together once all exist (a gate pipe), so no fork happens while threads of this process
// are serving the children already started.
std::vector<Process> fork_children(int n, const std::function<int(int)>& body);

// Waits until every process in `procs` has ended or `limit` has passed, then kills and reaps the
// ones still running (their timed_out() is true). True when all ended by themselves.
bool wait_all(std::vector<Process>& procs, milliseconds limit);

// How long run_process waits by default: under ctest's limit of 600 s for a whole test, so a hung
// run is reported with its log rather than by ctest.
inline constexpr milliseconds kRunLimit = seconds(480);

// Runs argv to its end with stdout+stderr in `log`, leading its own process group, and returns its
// exit status: -1 when it did not start, or did not end within `limit` (then it was killed with its
// group, and the log ends with a line saying so).
int run_process(const std::vector<std::string>& argv, const std::filesystem::path& log,
                milliseconds limit = kRunLimit);
// The same for any Spawn (its `out` gets the line).
int run_process(const Spawn& spec, milliseconds limit = kRunLimit);

// run_process of `/bin/sh -c cmd`.
inline int run_shell(const std::string& cmd, const std::filesystem::path& log, milliseconds limit = seconds(30)) {
  return run_process({"/bin/sh", "-c", cmd}, log, limit);
}

// Checks `done` every 20 ms until it holds or `limit` has passed; whether it held. It bounds a
// wait and times nothing.
template <typename Pred>
bool eventually(Pred done, milliseconds limit = seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

}  // namespace tandem::test
