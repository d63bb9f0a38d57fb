// The state a ProcessGroupNccl shares with its Works and its watchdog thread (for
// dist/group/cuda/process_group_nccl.cpp; compiled only in CUDA builds): the communicator and its lock,
// the communication stream, the in-flight collectives (each one's `done` event, issue time and the
// tensors it uses, kept alive until the event is reached), the group's error record, and the
// watchdog. Locks, threads and the error rules: dist/group/cuda/process_group_nccl.cpp's file comment.
// Invariants: every NCCL call on the communicator runs under `mu`; `inflight_mu` may be taken while
// `mu` is held, never the other way round; the error is written once, under `mu`, before `failed`
// is set, and never changes afterwards; tensors are released outside both locks.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda/context.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/group/process_group.h"

// ncclInProgress is not an error: a non-blocking communicator is still working on the call.
#define TANDEM_NCCL_CHECK(expr)                                                               \
  do {                                                                                        \
    const ncclResult_t tandem_nccl_res_ = (expr);                                             \
    if (tandem_nccl_res_ != ncclSuccess && tandem_nccl_res_ != ncclInProgress) [[unlikely]] { \
      const char* tandem_nccl_last_ = ncclGetLastError(nullptr);                              \
      TANDEM_FAIL(#expr, " failed: ", ncclGetErrorString(tandem_nccl_res_),                   \
                  (tandem_nccl_last_ && *tandem_nccl_last_) ? " (" : "",                      \
                  tandem_nccl_last_ ? tandem_nccl_last_ : "",                                 \
                  (tandem_nccl_last_ && *tandem_nccl_last_) ? ")" : "");                      \
    }                                                                                         \
  } while (0)

namespace tandem::dist::nccl_detail {

using Clock = std::chrono::steady_clock;

constexpr Millis kWatchdogPeriod{100};
// How long the destructor waits, after an abort, for the streams to drain before it keeps the
// tensors of the unreached collectives for good.
constexpr Millis kDrainAfterAbort{10000};
constexpr const char* kAbortedTail = "; the communicator was aborted and the group cannot be used any more";

// NCCL's name for `r`, with NCCL's last-error text when it has one.
std::string nccl_text(ncclResult_t r);
// "cudaErrorX: text".
std::string cuda_text(cudaError_t e);

// One CUDA event without timing, destroyed with its last owner (a collective's Work and its
// in-flight entry share `done`). Destroying an event that is not reached yet is fine: CUDA
// releases it once reached.
class Event {
 public:
  Event() { TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() {
    if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// One unfinished collective, as the group tracks it.
struct Inflight {
  std::shared_ptr<Event> done;
  std::string description;   // "allreduce(float32[1024], sum) on cuda:0"
  Clock::time_point issued;  // when the host queued it
  std::vector<Tensor> keep;  // what the communication stream uses, alive until `done` is reached
};

// Everything the group, its Works and its watchdog share. A Work may outlive the group: it then
// only reads its own event and the error record. Locks and threads: see the file comment.
struct NcclState {
  // Set by the constructor before any other thread exists; read-only afterwards.
  int device = 0;
  Millis timeout{0};
  std::string who;  // "ProcessGroupNccl rank 0 of 2 on cuda:0"

  std::mutex mu;              // the communicator
  ncclComm_t comm = nullptr;  // null once finalized or aborted
  cudaStream_t stream = nullptr;
  bool up = false;  // the constructor finished: recorded errors are printed to stderr

  std::atomic<bool> failed{false};
  std::string error;  // written once, under mu, before `failed` is set; immutable afterwards

  std::mutex inflight_mu;
  std::deque<Inflight> inflight;  // in stream order, so in reaching order

  std::mutex watchdog_mu;
  std::condition_variable watchdog_cv;
  bool stop = false;  // under watchdog_mu

  bool has_failed() const { return failed.load(std::memory_order_acquire); }
  // Requires has_failed().
  [[noreturn]] void throw_error() const { TANDEM_FAIL(error); }
  void throw_if_failed() const {
    if (has_failed()) throw_error();
  }

  // Requires mu. Aborts the communicator (its kernels return, so the streams drain) and records
  // `message` as the group's error unless one was recorded already; the first error of a group
  // that is up is printed once to stderr, since the host may never call into the group again.
  void abort_locked(const std::string& message);

  std::string timeout_message(const std::string& what, Millis t) const {
    return who + ": " + what + " did not complete within " + std::to_string(t.count()) +
           " ms (a rank is missing, stuck or issued collectives in another order)" + kAbortedTail;
  }

  // Requires mu and a communicator. When NCCL reports an asynchronous error, aborts, records an
  // error naming `what` and returns true.
  bool async_error_locked(const std::string& what);

  // Requires mu and a communicator. Polls the asynchronous state until it is not ncclInProgress
  // (a non-blocking communicator may still be working on the last call); on an error, or after
  // `limit`, aborts, records an error naming `what` and throws it. `init`: the communicator's
  // initialisation (the group never came up).
  void settle_locked(const std::string& what, Millis limit, bool init);

  // Moves the in-flight entries whose events were reached into `released`, for the caller to
  // destroy outside the lock. Returns the first event-query error other than "not ready"
  // (cudaSuccess if none); the entry it concerns stays first in the list.
  cudaError_t prune(std::vector<Inflight>& released);
  // prune(), releasing the tensors at once.
  cudaError_t release_reached() {
    std::vector<Inflight> released;
    return prune(released);  // `released` is destroyed after the lock is let go
  }

  bool inflight_empty() {
    std::lock_guard<std::mutex> lock(inflight_mu);
    return inflight.empty();
  }

  // The watchdog's round (see the file comment).
  void watchdog_tick();

  static void watchdog_main(std::shared_ptr<NcclState> s);
};

// The Work of one collective: wait() orders the compute stream after its `done` event (no host
// wait); synchronize() also waits on the host, aborting the group at its timeout. `host_wait`:
// wait() behaves as synchronize() (barrier).
std::shared_ptr<Work> make_nccl_work(std::shared_ptr<NcclState> state, std::shared_ptr<Event> done,
                                     std::string description, bool host_wait);

}  // namespace tandem::dist::nccl_detail
