// The state a ProcessGroupNccl shares with its Works and its watchdog (dist/group/cuda/nccl_state.h):
// aborting and the error record, settling a non-blocking communicator, releasing what reached
// collectives used, the watchdog's rounds, and the Work's waits.
#include "dist/group/cuda/nccl_state.h"

#include <cstdio>
#include <optional>
#include <thread>

#include "core/cuda/context.h"

namespace tandem::dist::nccl_detail {

namespace kc = tandem::cuda;

std::string nccl_text(ncclResult_t r) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

void NcclState::abort_locked(const std::string& message) {
  if (comm != nullptr) {
    (void)ncclCommAbort(comm);  // result ignored: nothing more can be done with this communicator
    comm = nullptr;
  }
  if (failed.load(std::memory_order_relaxed)) return;
  error = message;
  failed.store(true, std::memory_order_release);
  if (up) {
    std::fprintf(stderr, "[tandem] %s\n", error.c_str());
    std::fflush(stderr);
  }
}

bool NcclState::async_error_locked(const std::string& what) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  if (r != ncclSuccess) state = r;
  if (state == ncclSuccess || state == ncclInProgress) return false;
  abort_locked(who + ": " + what + " failed: NCCL reported " + nccl_text(state) + kAbortedTail);
  return true;
}

void NcclState::settle_locked(const std::string& what, Millis limit, bool init) {
  const auto deadline = Clock::now() + limit;
  const std::string tail = init ? "; the communicator was aborted" : kAbortedTail;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      abort_locked(who + ": " + what + " failed: " + nccl_text(state) + tail);
      throw_error();
    }
    if (Clock::now() >= deadline) {
      abort_locked(who + ": " + what + (init ? " did not finish within " : " could not be queued within ") +
                   std::to_string(limit.count()) + " ms (a rank is missing or stuck)" + tail);
      throw_error();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

cudaError_t NcclState::prune(std::vector<Inflight>& released) {
  std::lock_guard<std::mutex> lock(inflight_mu);
  while (!inflight.empty()) {
    const cudaError_t q = cudaEventQuery(inflight.front().done->get());
    if (q != cudaSuccess) {
      (void)cudaGetLastError();  // "not ready" or an error: neither may linger for a later check
      return q == cudaErrorNotReady ? cudaSuccess : q;
    }
    released.push_back(std::move(inflight.front()));
    inflight.pop_front();
  }
  return cudaSuccess;
}

void NcclState::watchdog_tick() {
  const cudaError_t query_error = release_reached();
  if (has_failed()) return;
  std::shared_ptr<Event> oldest;
  std::string what = "a collective";
  Clock::time_point issued{};
  {
    std::lock_guard<std::mutex> lock(inflight_mu);
    if (!inflight.empty()) {
      oldest = inflight.front().done;
      what = inflight.front().description;
      issued = inflight.front().issued;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  if (comm == nullptr || failed.load(std::memory_order_relaxed)) return;  // finalized or aborted
  if (query_error != cudaSuccess) {
    abort_locked(who + ": " + what + " failed: CUDA error while waiting for it: " + cuda_text(query_error) +
                 kAbortedTail);
    return;
  }
  if (async_error_locked(what)) return;
  if (oldest != nullptr && Clock::now() - issued > timeout) {
    // Asked again under `mu`: it may have been reached since the list was read.
    const cudaError_t q = cudaEventQuery(oldest->get());
    (void)cudaGetLastError();
    if (q == cudaErrorNotReady) abort_locked(timeout_message(what, timeout));
  }
}

void NcclState::watchdog_main(std::shared_ptr<NcclState> s) {
  std::optional<kc::DeviceGuard> guard;
  try {
    guard.emplace(s->device);  // for the thread's life; event queries work without it too
  } catch (...) {
  }
  std::unique_lock<std::mutex> lock(s->watchdog_mu);
  while (!s->stop) {
    s->watchdog_cv.wait_for(lock, kWatchdogPeriod, [&] { return s->stop; });
    if (s->stop) break;
    lock.unlock();
    try {
      s->watchdog_tick();
    } catch (...) {
      // An exception here (out of memory for a message) must not end the process; next round.
    }
    lock.lock();
  }
}

namespace {

class NcclWork final : public Work {
 public:
  // `host_wait`: wait() behaves as synchronize() (barrier).
  NcclWork(std::shared_ptr<NcclState> state, std::shared_ptr<Event> done, std::string description,
           bool host_wait)
      : state_(std::move(state)),
        done_(std::move(done)),
        description_(std::move(description)),
        host_wait_(host_wait) {}

  bool is_completed() override {
    if (state_->has_failed()) return true;  // it never will: wait() throws the group's error
    kc::DeviceGuard guard(state_->device);
    const cudaError_t q = cudaEventQuery(done_->get());
    if (q == cudaSuccess) return true;
    (void)cudaGetLastError();
    return q != cudaErrorNotReady;  // a CUDA error counts as completed: synchronize() reports it
  }

  void wait(Millis timeout) override {
    if (host_wait_) {
      synchronize(timeout);
      return;
    }
    order_compute_stream();
  }

  void synchronize(Millis timeout) override {
    order_compute_stream();
    NcclState& s = *state_;
    kc::DeviceGuard guard(s.device);
    kc::note_host_sync();  // the host waits below until the collective has run
    const auto deadline = Clock::now() + timeout;
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(done_->get());
      if (q == cudaSuccess) break;
      (void)cudaGetLastError();
      if (q != cudaErrorNotReady)
        TANDEM_FAIL(s.who, ": ", description_, " failed: CUDA error while waiting for it: ", cuda_text(q));
      s.throw_if_failed();  // the watchdog aborted meanwhile
      if (spins < 64) {
        std::this_thread::yield();
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(s.mu);
        if (!s.failed.load(std::memory_order_relaxed) && s.comm != nullptr)
          (void)s.async_error_locked(description_);
        if (!s.failed.load(std::memory_order_relaxed) && Clock::now() >= deadline) {
          const cudaError_t again = cudaEventQuery(done_->get());
          (void)cudaGetLastError();
          if (again == cudaErrorNotReady) s.abort_locked(s.timeout_message(description_, timeout));
        }
      }
      s.throw_if_failed();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    (void)s.release_reached();  // this collective's tensors, and its predecessors', go now
  }

  std::string description() const override { return description_; }

 private:
  // wait()'s whole work: throws the group's error, if any; else orders the compute stream after
  // the collective.
  void order_compute_stream() {
    state_->throw_if_failed();
    kc::DeviceGuard guard(state_->device);
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(kc::compute_stream(state_->device), done_->get(), 0));
  }

  const std::shared_ptr<NcclState> state_;
  const std::shared_ptr<Event> done_;
  const std::string description_;
  const bool host_wait_;
};

}  // namespace

std::shared_ptr<Work> make_nccl_work(std::shared_ptr<NcclState> state, std::shared_ptr<Event> done,
                                     std::string description, bool host_wait) {
  return std::make_shared<NcclWork>(std::move(state), std::move(done), std::move(description), host_wait);
}

}  // namespace tandem::dist::nccl_detail
