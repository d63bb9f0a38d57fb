// Helpers for the fault, soak and cluster tests: a child process started in the background with
// its output in a log file (killed with its process group if the test leaves it running), bounded
// waits for text in a log and for a process to exit, finding a tandem-run worker's pid by its
// RANK, a free TCP port, and counting this process's fds/threads and the machine's listening
// sockets and /dev/shm entries. Every wait is bounded; nothing here measures time for a result.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/require_data.h"
#include "common/test_util.h"

extern char** environ;

namespace tandem::test {

using std::chrono::milliseconds;
using std::chrono::seconds;

inline const std::string kSource = TANDEM_SOURCE_DIR;

// A background child; stdout+stderr go to `log`. `extra_env` ("K=V") overrides the inherited
// environment; an entry "K" without '=' removes K. With `own_group` it leads a new process group, killed as a
// whole on destruction.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::filesystem::path& log,
        const std::vector<std::string>& extra_env = {}, bool own_group = true)
      : log_(log) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      bool overridden = false;
      for (const std::string& x : extra_env) overridden = overridden || x.substr(0, x.find('=')) == key;
      if (!overridden) env.push_back(kv);
    }
    for (const std::string& x : extra_env)
      if (x.find('=') != std::string::npos) env.push_back(x);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    if (own_group) {
      posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attr, 0);
    }
    own_group_ = own_group;
    if (posix_spawn(&pid_, args[0], &actions, &attr, args.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  ~Child() {
    if (pid_ > 0 && !status_) {
      ::kill(own_group_ ? -pid_ : pid_, SIGKILL);
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  std::string output() const { return read_file(log_); }

  // The exit code (128 + signal when killed) once the child ends, or nullopt after `limit`.
  std::optional<int> wait_for(milliseconds limit) {
    if (status_) return status_;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
        return status_;
      }
      if (r < 0 && errno != EINTR) return std::nullopt;
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  // True once `needle` appears in the log, false after `limit` or when the child ended first.
  bool wait_for_text(const std::string& needle, milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (output().find(needle) != std::string::npos) return true;
      int st = 0;
      if (!status_ && ::waitpid(pid_, &st, WNOHANG) == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
        return output().find(needle) != std::string::npos;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  bool own_group_ = true;
  std::optional<int> status_;
};

inline bool process_exists(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  // A zombie still answers kill(0): count it as gone.
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), {});
  const size_t close = all.rfind(')');
  return close != std::string::npos && close + 2 < all.size() && all[close + 2] != 'Z';
}

// Every process on the machine (the numeric entries of /proc).
inline std::vector<pid_t> all_pids() {
  std::vector<pid_t> out;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename();
    if (name.find_first_not_of("0123456789") == std::string::npos) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// Whether a process's initial environment holds `entry` (e.g. a test's "MARK=<pid>").
inline bool carries_env(pid_t pid, const std::string& entry) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string env((std::istreambuf_iterator<char>(in)), {});
  std::istringstream items(env);
  std::string kv;
  while (std::getline(items, kv, '\0'))
    if (kv == entry) return true;
  return false;
}

// The direct children of `parent` (from /proc).
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (pid_t pid : all_pids()) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string all((std::istreambuf_iterator<char>(in)), {});
    const size_t close = all.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(all.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(pid);
  }
  return out;
}

// The pid of the worker of `launcher` whose environment has RANK=<rank>, or -1.
inline pid_t worker_pid(pid_t launcher, int rank) {
  const std::string want = "RANK=" + std::to_string(rank);
  for (pid_t p : children_of(launcher))
    if (carries_env(p, want)) return p;
  return -1;
}

// A TCP port that was free on 127.0.0.1 a moment ago.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

inline size_t count_entries(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

inline size_t open_fds() { return count_entries("/proc/self/fd"); }
inline size_t threads() { return count_entries("/proc/self/task"); }
inline std::set<std::string> shm_entries() {
  std::set<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/dev/shm", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    out.insert(it->path().filename().string());
  return out;
}

// The creating process's pid of a shared-memory segment of the engine ("tandem-<pid>-<nonce>"),
// or 0 for any other /dev/shm entry.
inline pid_t shm_creator(const std::string& entry) {
  static const std::string prefix = "tandem-";
  if (entry.rfind(prefix, 0) != 0) return 0;
  const size_t end = entry.find('-', prefix.size());
  if (end == std::string::npos || end == prefix.size()) return 0;
  const std::string digits = entry.substr(prefix.size(), end - prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return static_cast<pid_t>(std::stol(digits));
}

// The engine's segments in /dev/shm that were not in `before` and that no process can still
// unlink: their creator is `owner` (a process whose jobs have all finished) or has exited. Segments
// of other live processes (tests running beside this one) are theirs to clean, not leaks.
inline std::vector<std::string> leaked_shm_segments(const std::set<std::string>& before, pid_t owner = 0) {
  std::vector<std::string> out;
  for (const auto& entry : shm_entries()) {
    const pid_t creator = shm_creator(entry);
    if (creator == 0 || before.count(entry)) continue;
    if (creator == owner || !process_exists(creator)) out.push_back(entry);
  }
  return out;
}

// The socket inodes of a process's open fds ("socket:[N]" links in /proc/<pid>/fd).
inline std::set<std::string> socket_inodes(const std::string& proc_dir) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(proc_dir + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code lec;
    const std::string target = std::filesystem::read_symlink(it->path(), lec).string();
    if (!lec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  return inodes;
}

// Sockets in LISTEN state on the machine (IPv4 and IPv6), from /proc/net/tcp{,6}: inode -> port.
inline std::map<std::string, int> listening_sockets() {
  std::map<std::string, int> out;
  for (const char* f : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(f);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string field[10];
      for (auto& x : field) row >> x;  // sl local remote st tx:rx tr:when retrnsmt uid timeout inode
      if (field[3] != "0A") continue;  // TCP_LISTEN
      const size_t colon = field[1].rfind(':');
      if (colon != std::string::npos) out[field[9]] = std::stoi(field[1].substr(colon + 1), nullptr, 16);
    }
  }
  return out;
}

// The processes holding a socket that listens on `port`. A port that a finished job used may be
// taken again at once by a test running beside this one, so a check for leftovers asks who listens.
inline std::vector<pid_t> listening_pids(int port) {
  std::set<std::string> wanted;
  for (const auto& [inode, p] : listening_sockets())
    if (p == port) wanted.insert(inode);
  std::vector<pid_t> out;
  if (wanted.empty()) return out;
  for (pid_t pid : all_pids()) {
    for (const auto& inode : socket_inodes("/proc/" + std::to_string(pid)))
      if (wanted.count(inode)) {
        out.push_back(pid);
        break;
      }
  }
  return out;
}

// Listening TCP sockets owned by this process.
inline size_t own_listening_sockets() {
  const auto own = socket_inodes("/proc/self");
  size_t n = 0;
  for (const auto& [inode, port] : listening_sockets()) n += own.count(inode);
  return n;
}

// Line count, for "one clear line" checks.
inline size_t lines_in(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace tandem::test
