// The queue of a Gloo group's collectives (dist/group/gloo_work.h).
#include "dist/group/gloo_work.h"

#include <chrono>
#include <exception>

#include "core/error.h"

namespace tandem::dist {

// One issued collective: its body, run by the worker thread, and the state callers wait on.
class GlooWork final : public Work {
 public:
  // `grace`: how long past the group's timeout wait(t >= group timeout) keeps waiting for a
  // collective that has started, so that Gloo's own error (and the diagnosis naming the stuck
  // peer) is what the caller sees rather than a bare "did not complete".
  GlooWork(std::string description, std::string who, std::function<void(uint32_t tag)> body, Millis timeout,
           Millis grace)
      : description_(std::move(description)),
        who_(std::move(who)),
        body_(std::move(body)),
        timeout_(timeout),
        grace_(grace) {}

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  void wait(Millis timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto finished = [&] { return done_; };
    // A caller willing to wait the group's whole timeout gets Gloo's own verdict (which comes
    // at about the same moment, plus the diagnosis); a shorter wait ends when it says.
    if (!cv_.wait_for(lock, timeout, finished) && started_ && timeout >= timeout_)
      cv_.wait_until(lock, started_at_ + timeout_ + grace_, finished);
    if (!done_)
      TANDEM_FAIL(who_, ": ", description_, " did not complete within ", timeout.count(),
                  " ms (a peer is slower, stuck or gone; Gloo ends it after the group's timeout)");
    if (!error_.empty()) TANDEM_FAIL(who_, ": ", description_, " failed: ", error_);
  }

  std::string description() const override { return description_; }

  // Worker thread only: runs the body unless the group is already broken; returns the error
  // text ("" on success). The Work stays pending until finish().
  std::string execute(uint32_t tag, const std::string& broken) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_ = true;
      started_at_ = std::chrono::steady_clock::now();
    }
    std::string error;
    if (!broken.empty()) {
      error = "not run because an earlier collective of this group failed: " + broken;
    } else {
      try {
        body_(tag);
      } catch (const std::exception& e) {
        error = e.what();
        if (error.empty()) error = "unknown Gloo error";
      } catch (...) {
        error = "unknown non-standard exception";
      }
    }
    body_ = nullptr;  // releases the tensors the body captured
    return error;
  }

  // Worker thread only: completes the Work with `error` ("" = success).
  void finish(const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = error;
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  const std::string description_;
  const std::string who_;  // "ProcessGroupGloo rank 0 of 2"
  std::function<void(uint32_t)> body_;
  const Millis timeout_, grace_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  std::chrono::steady_clock::time_point started_at_{};
  bool done_ = false;
  std::string error_;
};

GlooQueue::GlooQueue(std::string who, Millis timeout, Millis grace, Explain explain)
    : who_(std::move(who)), timeout_(timeout), grace_(grace), explain_(std::move(explain)) {}

GlooQueue::~GlooQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void GlooQueue::start() { worker_ = std::thread([this] { loop(); }); }

std::shared_ptr<Work> GlooQueue::enqueue(std::string description, std::function<void(uint32_t)> body) {
  auto work = std::make_shared<GlooWork>(std::move(description), who_, std::move(body), timeout_, grace_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    TANDEM_CHECK(!stop_, who_, ": collective issued while the group is being destroyed");
    queue_.push_back(work);
  }
  cv_.notify_one();
  return work;
}

void GlooQueue::loop() {
  for (;;) {
    std::shared_ptr<GlooWork> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and drained
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    const uint32_t tag = next_tag_++;
    std::string error = work->execute(tag, broken_);
    if (!error.empty() && broken_.empty()) {
      error = explain_(error, tag);
      broken_ = work->description() + ": " + error;
    }
    work->finish(error);
  }
}

}  // namespace tandem::dist
