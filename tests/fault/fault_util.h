// Helpers for the fault, soak and cluster tests: finding processes in /proc (a tandem-run worker's
// pid by its RANK, the carriers of an environment entry, a process's children) and counting this
// process's fds/threads and the machine's listening sockets and /dev/shm entries. The processes
// they start are common/process.h's (a Process with its output in a log, leading its own process
// group, killed with it if the test leaves it running; bounded waits for its exit and its text).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace tandem::test {

inline const std::string kSource = TANDEM_SOURCE_DIR;

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

}  // namespace tandem::test
