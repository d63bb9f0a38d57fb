// The harness's processes (process.h): posix_spawn and fork, and the bounded waits on them.
#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>

extern char** environ;

namespace tandem::test {
namespace {

std::string key_of(const std::string& entry) { return entry.substr(0, entry.find('=')); }

// This process's environment changed by `changes` ("K=V" sets K, "K" removes it).
std::vector<std::string> environment_with(const std::vector<std::string>& changes) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool changed = false;
    for (const std::string& c : changes) changed = changed || key_of(c) == key_of(kv);
    if (!changed) env.push_back(kv);
  }
  for (const std::string& c : changes)
    if (c.find('=') != std::string::npos) env.push_back(c);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

int exit_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  return WIFSIGNALED(wait_status) ? 128 + WTERMSIG(wait_status) : -1;
}

}  // namespace

Process::Process(const Spawn& spec) : own_group_(spec.own_group), out_(spec.out) {
  std::vector<std::string> args = spec.argv, env = environment_with(spec.env);
  std::vector<char*> argv = pointers(args), envp = pointers(env);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC;
  if (!spec.out.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, spec.out.c_str(), kFlags, 0644);
    if (spec.err.empty()) posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  if (!spec.err.empty()) posix_spawn_file_actions_addopen(&actions, 2, spec.err.c_str(), kFlags, 0644);
  if (!spec.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, spec.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (own_group_) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
  }
  if (argv[0] == nullptr || posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), envp.data()) != 0) {
    pid_ = -1;
    status_ = -1;
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
}

Process::Process(const std::vector<std::string>& argv, const std::filesystem::path& log,
                 const std::vector<std::string>& env)
    : Process(Spawn{.argv = argv, .env = env, .out = log, .own_group = true}) {}

Process Process::fork(const std::function<int()>& body) {
  std::fflush(nullptr);  // or the child would write this process's buffered output again
  Process p;
  p.pid_ = ::fork();
  if (p.pid_ == 0) {
    int code = 0;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child (pid %d): %s\n", static_cast<int>(::getpid()), e.what());
      code = 3;
    } catch (...) {
      std::fprintf(stderr, "child (pid %d): an exception that is not a std::exception\n",
                   static_cast<int>(::getpid()));
      code = 3;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  if (p.pid_ < 0) p.status_ = -1;
  return p;
}

Process::~Process() {
  if (started() && !status_) kill_and_reap();
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    if (started() && !status_) kill_and_reap();
    pid_ = other.pid_;
    own_group_ = other.own_group_;
    timed_out_ = other.timed_out_;
    out_ = std::move(other.out_);
    status_ = other.status_;
    other.pid_ = -1;
    other.status_.reset();
  }
  return *this;
}

std::string Process::output() const {
  std::ifstream in(out_, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool Process::running() {
  if (status_) return false;
  if (!started()) {
    status_ = -1;
    return false;
  }
  int st = 0;
  const pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    status_ = exit_status(st);
  } else if (r < 0 && errno != EINTR) {
    status_ = -1;  // not a child of ours (any more): nothing to wait for
  }
  return !status_;
}

void Process::kill_and_reap() {
  ::kill(own_group_ ? -pid_ : pid_, SIGKILL);
  int st = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &st, 0)) < 0 && errno == EINTR) {
  }
  status_ = r == pid_ ? exit_status(st) : -1;
}

std::optional<int> Process::wait_for(milliseconds limit) {
  eventually([&] { return !running(); }, limit);
  return status_;
}

std::optional<int> Process::finish(milliseconds limit) {
  finish_all({this}, limit);
  if (timed_out_) return std::nullopt;
  return status_;
}

bool Process::wait_for_text(const std::string& needle, milliseconds limit) {
  auto found = [&] { return output().find(needle) != std::string::npos; };
  return eventually([&] { return found() || !running(); }, limit) && found();
}

std::vector<Process> fork_children(int n, const std::function<int(int)>& body) {
  int gate[2];
  if (::pipe2(gate, O_CLOEXEC) != 0) return std::vector<Process>(static_cast<size_t>(n));
  std::vector<Process> children;
  for (int i = 0; i < n; ++i)
    children.push_back(Process::fork([&, i] {
      ::close(gate[1]);
      char c;
      while (::read(gate[0], &c, 1) < 0 && errno == EINTR) {
      }
      ::close(gate[0]);
      return body(i);
    }));
  ::close(gate[0]);
  ::close(gate[1]);  // opens the gate: every child reads end-of-file
  return children;
}

bool Process::finish_all(const std::vector<Process*>& procs, milliseconds limit) {
  const bool all = eventually(
      [&] {
        bool done = true;
        for (Process* p : procs) done = !p->running() && done;
        return done;
      },
      limit);
  if (!all)
    for (Process* p : procs)
      if (p->running()) {
        p->kill_and_reap();
        p->timed_out_ = true;
      }
  return all;
}

bool wait_all(std::vector<Process>& procs, milliseconds limit) {
  std::vector<Process*> all;
  for (Process& p : procs) all.push_back(&p);
  return Process::finish_all(all, limit);
}

int run_process(const Spawn& spec, milliseconds limit) {
  Process p(spec);
  const std::optional<int> rc = p.finish(limit);
  if (p.timed_out() && !spec.out.empty())
    std::ofstream(spec.out, std::ios::app) << "\n[run_process: still running after " << limit.count()
                                           << " ms; killed" << (spec.own_group ? " with its process group" : "")
                                           << "]\n";
  return rc.value_or(-1);
}

int run_process(const std::vector<std::string>& argv, const std::filesystem::path& log, milliseconds limit) {
  return run_process(Spawn{.argv = argv, .out = log, .own_group = true}, limit);
}

}  // namespace tandem::test
