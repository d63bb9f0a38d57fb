// tandem-run's console: its own messages ("tandem-run: ...") on stderr, and the
// workers' output forwarded line by line with a "[rank r] " prefix to the stream
// it came from. One mutex orders every write so lines never interleave; each line
// leaves in a single write(2). Write errors (a closed console) are ignored.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace tandem::run {

// Writes "tandem-run: <msg>\n" to stderr.
void say(const std::string& msg);

// Forwards one worker's stdout and stderr pipes (it owns and closes both fds)
// on its own thread until both reach end-of-file, or until finish() has been
// called and its drain deadline has passed (a straggler that escaped the
// worker's process group may keep a pipe open forever).
class Forwarder {
 public:
  Forwarder(int rank, int out_fd, int err_fd);
  ~Forwarder();
  Forwarder(const Forwarder&) = delete;
  Forwarder& operator=(const Forwarder&) = delete;

  // Asks the thread to stop after at most `drain` more (it stops sooner at end-of-file).
  void stop_after(std::chrono::milliseconds drain);
  // stop_after(drain), then joins the thread.
  void finish(std::chrono::milliseconds drain);

 private:
  void loop();
  int rank_;
  int fds_[2];
  std::atomic<int64_t> deadline_ns_{0};  // 0: none yet (steady clock)
  std::thread thread_;
};

}  // namespace tandem::run
