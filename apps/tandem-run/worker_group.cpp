// Spawning and supervising workers (see worker_group.h). The child side of
// fork() only calls async-signal-safe functions: everything it needs (argv,
// envp, file descriptors) is prepared before fork.
#include "worker_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>

#include "console.h"

namespace tandem::run {
namespace {

using Clock = std::chrono::steady_clock;

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return "was killed by " + signal_name(WTERMSIG(status)) + " (exit code " +
           std::to_string(exit_code_of(status)) + ")";
  return "failed with exit code " + std::to_string(exit_code_of(status));
}

bool mkdirs(const std::string& dir) {
  std::string path;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    path = dir.substr(0, pos);
    if (path.empty()) continue;
    if (::mkdir(path.c_str(), 0777) != 0 && errno != EEXIST) return false;
  }
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

struct Worker {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool alive = false;
  int status = 0;
  std::unique_ptr<Forwarder> forwarder;
};

// Builds the worker's environment: the inherited one minus the variables we set, plus ours.
std::vector<std::string> worker_env(const GroupSpec& spec, int attempt, int rank, int local_rank) {
  const RunOptions& o = spec.options;
  const int world = o.nnodes * o.nproc_per_node;
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", spec.master_addr},
      {"MASTER_PORT", std::to_string(spec.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
  };
  std::vector<std::string> env;
  for (const std::string& kv : spec.base_env) {
    const std::string key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& [k, v] : ours) overridden = overridden || k == key;
    if (!overridden) env.push_back(kv);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Child side of fork: only async-signal-safe calls from here to execve.
[[noreturn]] void exec_child(pid_t parent, int in_fd, int out_fd, int err_fd, int status_fd, const char* path,
                             char* const* argv, char* const* envp) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // tandem-run died before prctl
  if (::dup2(in_fd, STDIN_FILENO) < 0 || ::dup2(out_fd, STDOUT_FILENO) < 0 ||
      ::dup2(err_fd, STDERR_FILENO) < 0) {
    const int err = errno;
    [[maybe_unused]] ssize_t n = ::write(status_fd, &err, sizeof(err));
    ::_exit(127);
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(path, argv, envp);
  const int err = errno;
  [[maybe_unused]] ssize_t n = ::write(status_fd, &err, sizeof(err));
  ::_exit(127);
}

class Supervisor {
 public:
  Supervisor(const GroupSpec& spec, int attempt) : spec_(spec), attempt_(attempt) {}
  ~Supervisor() {
    if (null_fd_ >= 0) ::close(null_fd_);
  }

  GroupResult run() {
    const RunOptions& o = spec_.options;
    null_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd_ < 0) return spawn_failed(-1, std::string("cannot open /dev/null: ") + std::strerror(errno));
    if (!o.log_dir.empty() && !mkdirs(o.log_dir))
      return spawn_failed(-1, "cannot create --log-dir " + o.log_dir + ": " + std::strerror(errno));
    workers_.resize(static_cast<size_t>(o.nproc_per_node));
    for (int local = 0; local < o.nproc_per_node; ++local) {
      Worker& w = workers_[static_cast<size_t>(local)];
      w.local_rank = local;
      w.rank = o.node_rank * o.nproc_per_node + local;
      if (std::string err = spawn(w); !err.empty()) {
        terminate_all(SIGKILL);
        reap_all_blocking();
        finish_forwarders();
        return spawn_failed(w.rank, err);
      }
    }
    GroupResult result = supervise();
    finish_forwarders();
    return result;
  }

 private:
  GroupResult spawn_failed(int rank, const std::string& err) {
    say("error: " + (rank >= 0 ? "cannot start rank " + std::to_string(rank) + ": " + err : err));
    GroupResult r;
    r.kind = GroupResult::Kind::kSpawnFailed;
    r.exit_code = err.find("Permission denied") != std::string::npos ? 126 : 127;
    r.failed_rank = rank;
    return r;
  }

  // Starts one worker; returns "" or what went wrong.
  std::string spawn(Worker& w) {
    const RunOptions& o = spec_.options;
    std::vector<std::string> env = worker_env(spec_, attempt_, w.rank, w.local_rank);
    std::vector<std::string> args = o.command;
    std::vector<char*> argv = c_strings(args), envp = c_strings(env);

    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, status_pipe[2] = {-1, -1};
    int log_fd = -1;
    auto close_all = [&] {
      for (int fd :
           {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], status_pipe[0], status_pipe[1], log_fd})
        if (fd >= 0) ::close(fd);
    };
    if (::pipe2(status_pipe, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
    int child_out = -1, child_err = -1;
    if (o.log_dir.empty()) {
      if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
        const int err = errno;
        close_all();
        return std::string("pipe: ") + std::strerror(err);
      }
      child_out = out_pipe[1];
      child_err = err_pipe[1];
    } else {
      const std::string file = o.log_dir + "/rank_" + std::to_string(w.rank) + ".log";
      log_fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (attempt_ == 0 ? O_TRUNC : 0),
                      0644);
      if (log_fd < 0) {
        const int err = errno;
        close_all();
        return "cannot open " + file + ": " + std::strerror(err);
      }
      if (attempt_ > 0) {
        const std::string header = "tandem-run: restart " + std::to_string(attempt_) + " of " +
                                   std::to_string(o.max_restarts) + "\n";
        [[maybe_unused]] ssize_t n = ::write(log_fd, header.data(), header.size());
      }
      child_out = child_err = log_fd;
    }

    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      close_all();
      return std::string("fork: ") + std::strerror(err);
    }
    if (pid == 0)
      exec_child(parent, null_fd_, child_out, child_err, status_pipe[1], spec_.program_path.c_str(),
                 argv.data(), envp.data());
    ::setpgid(pid, pid);  // also in the child; whichever runs first wins the race
    w.pid = pid;
    w.alive = true;
    ::close(status_pipe[1]);
    status_pipe[1] = -1;
    for (int* fd : {&out_pipe[1], &err_pipe[1], &log_fd})
      if (*fd >= 0) {
        ::close(*fd);
        *fd = -1;
      }
    // The status pipe closes on a successful exec, or carries the child's errno.
    int child_errno = 0;
    ssize_t got;
    do {
      got = ::read(status_pipe[0], &child_errno, sizeof(child_errno));
    } while (got < 0 && errno == EINTR);
    ::close(status_pipe[0]);
    status_pipe[0] = -1;
    if (o.log_dir.empty()) {
      w.forwarder = std::make_unique<Forwarder>(w.rank, out_pipe[0], err_pipe[0]);
      out_pipe[0] = err_pipe[0] = -1;
    }
    if (got == static_cast<ssize_t>(sizeof(child_errno)))
      return "cannot execute " + spec_.program_path + ": " + std::strerror(child_errno);
    return "";
  }

  void terminate_all(int sig) {
    for (Worker& w : workers_)
      if (w.pid > 0) ::kill(-w.pid, sig);  // the worker's whole process group
  }

  // Reaps every worker that has exited; returns the ones reaped in rank order.
  std::vector<Worker*> reap() {
    std::vector<Worker*> done;
    for (Worker& w : workers_) {
      if (!w.alive) continue;
      int status = 0;
      const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == w.pid || (r < 0 && errno == ECHILD)) {
        w.alive = false;
        w.status = status;
        done.push_back(&w);
      }
    }
    return done;
  }

  void reap_all_blocking() {
    for (Worker& w : workers_)
      if (w.alive) {
        while (::waitpid(w.pid, &w.status, 0) < 0 && errno == EINTR) {
        }
        w.alive = false;
      }
  }

  int alive_count() const {
    int n = 0;
    for (const Worker& w : workers_) n += w.alive ? 1 : 0;
    return n;
  }

  // All forwarders drain at once (at most 1 s more), then are joined.
  void finish_forwarders() {
    for (Worker& w : workers_)
      if (w.forwarder) w.forwarder->stop_after(std::chrono::milliseconds(1000));
    for (Worker& w : workers_)
      if (w.forwarder) w.forwarder->finish(std::chrono::milliseconds(1000));
  }

  GroupResult supervise() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&set, sig);
    GroupResult result;
    int received = 0;     // the first SIGINT/SIGTERM/... taken
    bool ending = false;  // SIGTERM (or the forwarded signal) sent; waiting for the grace period
    bool killed = false;  // SIGKILL sent
    Clock::time_point kill_at{};
    const auto grace = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(spec_.options.grace_seconds));

    auto begin_ending = [&](int sig) {
      ending = true;
      kill_at = Clock::now() + grace;
      terminate_all(sig);
    };

    while (alive_count() > 0) {
      timespec ts{0, 50 * 1000 * 1000};
      siginfo_t info;
      const int sig = ::sigtimedwait(&set, &info, &ts);
      if (sig > 0 && sig != SIGCHLD) {
        if (received == 0) {
          received = sig;
          say("received " + signal_name(sig) + "; forwarding it to the workers");
          begin_ending(sig);
        } else if (!killed) {
          say("received " + signal_name(sig) + " again; killing the workers");
          terminate_all(SIGKILL);
          killed = true;
        }
      }
      std::vector<Worker*> failed;
      for (Worker* w : reap())
        if (exit_code_of(w->status) != 0 && !ending && !received) failed.push_back(w);
      auto any_signaled = [&] {
        return std::any_of(failed.begin(), failed.end(), [](Worker* f) { return WIFSIGNALED(f->status); });
      };
      // A rank that failed on a broken connection may have seen its peer die before that peer is
      // reapable: give a killed peer a moment to show up, so the cause is what gets reported.
      for (const auto until = Clock::now() + std::chrono::milliseconds(300);
           !failed.empty() && !any_signaled() && alive_count() > 0 && Clock::now() < until;) {
        ::usleep(20 * 1000);
        for (Worker* w : reap())
          if (exit_code_of(w->status) != 0) failed.push_back(w);
      }
      if (!failed.empty()) {
        // Several found dead: a rank killed by a signal is the likelier cause (the others then
        // fail on their broken connections), so it is the one reported; else the lowest rank.
        auto by_signal =
            std::find_if(failed.begin(), failed.end(), [](Worker* f) { return WIFSIGNALED(f->status); });
        Worker* w = by_signal != failed.end() ? *by_signal : failed.front();
        result.kind = GroupResult::Kind::kWorkerFailed;
        result.exit_code = exit_code_of(w->status);
        result.failed_rank = w->rank;
        result.signal = WIFSIGNALED(w->status) ? WTERMSIG(w->status) : 0;
        result.what = describe_status(w->status);
        std::string also;
        for (Worker* f : failed)
          if (f != w) also += "; rank " + std::to_string(f->rank) + " also " + describe_status(f->status);
        const int others = alive_count();
        say("rank " + std::to_string(w->rank) + " (local rank " + std::to_string(w->local_rank) + ", pid " +
            std::to_string(w->pid) + ") " + describe_status(w->status) + also +
            (others > 0 ? "; ending the other " + std::to_string(others) + " worker(s)" : ""));
        begin_ending(SIGTERM);
      }
      if (!ending && !received && spec_.stop_reason && alive_count() > 0)
        if (const std::string why = spec_.stop_reason(); !why.empty()) {
          say(why + "; ending this node's " + std::to_string(alive_count()) + " worker(s)");
          result.kind = GroupResult::Kind::kStopped;
          result.exit_code = 1;
          begin_ending(SIGTERM);
        }
      if (ending && !killed && Clock::now() >= kill_at && alive_count() > 0) {
        std::ostringstream grace_text;
        grace_text << spec_.options.grace_seconds;
        say("workers still running " + grace_text.str() + " s after the request to stop; sending SIGKILL");
        terminate_all(SIGKILL);
        killed = true;
      }
    }
    // Sweep up what the workers started, unless everything went well.
    if (ending) terminate_all(SIGKILL);
    if (received) {
      result.kind = GroupResult::Kind::kInterrupted;
      result.exit_code = 128 + received;
    }
    return result;
  }

  const GroupSpec& spec_;
  int attempt_;
  int null_fd_ = -1;
  std::vector<Worker> workers_;
};

}  // namespace

GroupResult run_worker_group(const GroupSpec& spec, int attempt) { return Supervisor(spec, attempt).run(); }

void block_supervisor_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&set, sig);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the launcher
}

std::string find_program(const std::string& program) {
  auto runnable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return program;  // execve reports what is wrong
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (true) {
    const size_t colon = path.find(':', start);
    const std::string dir =
        path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (runnable(candidate)) return candidate;
    if (colon == std::string::npos) return "";
    start = colon + 1;
  }
}

}  // namespace tandem::run
