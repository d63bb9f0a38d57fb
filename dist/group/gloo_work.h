// The queue of a Gloo group's collectives (for dist/group/process_group_gloo.cpp): a FIFO of GlooWork and
// the one worker thread that runs them, one at a time, in issue order (Gloo calls block), so every
// rank runs them in the same order when every rank issues them in the same order.
// Invariants: each Work is finished exactly once, by the worker thread, after its body ran or was
// refused; after the first failure the group is broken and every later Work fails at once, naming
// that failure (Gloo's pairs are unusable after an error). The destructor runs what is queued (each
// ends within Gloo's timeout; after a failure at once) and joins the thread: it never hangs.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dist/group/process_group.h"

namespace tandem::dist {

class GlooWork;

class GlooQueue {
 public:
  // explain(error, tag): the message a collective's first failure is reported with (the worker
  // thread calls it, once). `timeout`: the group's; `grace`: how long past it a caller willing to
  // wait the whole timeout keeps waiting for a started collective, so that Gloo's own error and
  // explain()'s diagnosis reach it rather than a bare "did not complete".
  using Explain = std::function<std::string(const std::string& error, uint32_t tag)>;
  GlooQueue(std::string who, Millis timeout, Millis grace, Explain explain);
  ~GlooQueue();
  GlooQueue(const GlooQueue&) = delete;
  GlooQueue& operator=(const GlooQueue&) = delete;

  // Starts the worker thread; it inherits the caller's signal mask (the group blocks SIGPIPE).
  void start();
  // Queues body(tag) (tags count the group's collectives from 0) and returns its Work.
  std::shared_ptr<Work> enqueue(std::string description, std::function<void(uint32_t tag)> body);

 private:
  void loop();

  const std::string who_;  // "ProcessGroupGloo rank 0 of 2"
  const Millis timeout_, grace_;
  const Explain explain_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GlooWork>> queue_;
  bool stop_ = false;
  std::thread worker_;
  // Worker thread only.
  uint32_t next_tag_ = 0;
  std::string broken_;  // "<op>: <error>" of the first failed collective
};

}  // namespace tandem::dist
