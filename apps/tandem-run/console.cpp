// Console output for tandem-run (see console.h).
#include "console.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

namespace tandem::run {
namespace {

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are forwarded in pieces
std::mutex g_console_mutex;

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void say(const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_console_mutex);
  write_all(STDERR_FILENO, "tandem-run: " + msg + "\n");
}

Forwarder::Forwarder(int rank, int out_fd, int err_fd) : rank_(rank), fds_{out_fd, err_fd} {
  thread_ = std::thread([this] { loop(); });
}

Forwarder::~Forwarder() { finish(std::chrono::milliseconds(0)); }

void Forwarder::stop_after(std::chrono::milliseconds drain) {
  const int64_t deadline = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(drain).count();
  int64_t expected = 0;
  deadline_ns_.compare_exchange_strong(expected, deadline);  // the first deadline set stays
}

void Forwarder::finish(std::chrono::milliseconds drain) {
  if (!thread_.joinable()) return;
  stop_after(drain);
  thread_.join();
}

void Forwarder::loop() {
  const std::string prefix = "[rank " + std::to_string(rank_) + "] ";
  const int targets[2] = {STDOUT_FILENO, STDERR_FILENO};
  std::string pending[2];
  bool open[2] = {fds_[0] >= 0, fds_[1] >= 0};
  char buf[16384];

  auto emit = [&](int i, bool flush_partial) {
    std::string out;
    size_t start = 0;
    while (true) {
      const size_t nl = pending[i].find('\n', start);
      if (nl == std::string::npos) break;
      out += prefix;
      out.append(pending[i], start, nl - start + 1);
      start = nl + 1;
    }
    pending[i].erase(0, start);
    if (!pending[i].empty() && (flush_partial || pending[i].size() >= kMaxLine)) {
      out += prefix + pending[i] + "\n";
      pending[i].clear();
    }
    if (!out.empty()) {
      std::lock_guard<std::mutex> lock(g_console_mutex);
      write_all(targets[i], out);
    }
  };
  auto close_fd = [&](int i) {
    emit(i, true);
    ::close(fds_[i]);
    open[i] = false;
  };

  while (open[0] || open[1]) {
    pollfd p[2];
    int idx[2];
    nfds_t n = 0;
    for (int i = 0; i < 2; ++i)
      if (open[i]) {
        p[n] = {fds_[i], POLLIN, 0};
        idx[n++] = i;
      }
    const int rc = ::poll(p, n, 100);
    if (rc < 0 && errno != EINTR) break;
    for (nfds_t k = 0; rc > 0 && k < n; ++k) {
      if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))) continue;
      const int i = idx[k];
      const ssize_t got = ::read(fds_[i], buf, sizeof(buf));
      if (got > 0) {
        pending[i].append(buf, static_cast<size_t>(got));
        emit(i, false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        close_fd(i);
      }
    }
    const int64_t deadline = deadline_ns_.load();
    if (deadline != 0 && now_ns() >= deadline) break;
  }
  for (int i = 0; i < 2; ++i)
    if (open[i]) close_fd(i);
}

}  // namespace tandem::run
