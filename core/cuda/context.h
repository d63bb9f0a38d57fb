// Internal to the CUDA backend (core/cuda, kernels/cuda, dist's NCCL code); never included by a
// public header, and free of cuDNN/cuBLAS (their handles live in kernels/cuda/common.h). Owns the
// per-device CUDA state every GPU kernel runs against, as PyTorch's c10/cuda does:
//  - one compute stream per device, created lazily (non-blocking: it does not synchronise with
//    the legacy default stream). ALL compute work of the backend is queued on it, so work is
//    ordered by the stream alone; nothing here calls cudaDeviceSynchronize. Code that uses another
//    stream (the NCCL communication stream) orders itself against this one with events;
//  - the device guards. A process sets its device once (set_device, called where it picks one:
//    the trainer, a test, an embedding program); every launch still runs under a guard for its
//    tensors' device, because the only way to get a compute stream for a launch is a StreamGuard,
//    which makes that device current for its scope (launch() in core/cuda/launch.cuh takes one);
//  - the check macro: every CUDA runtime call goes through TANDEM_CUDA_CHECK, and a failure throws
//    tandem::Error carrying file:line, the failing expression and the runtime's error name and text;
//  - the host-sync counter (host_sync_count in core/device.h): every place in the engine that blocks
//    the host on the device calls stream_synchronize / device_synchronize / note_host_sync here,
//    so one counter sees them all; uploads are counted by note_host_upload;
//  - a small device-side error record for kernels that find bad input (an out-of-range nll_loss
//    target) without a host synchronisation: it is read, and thrown as tandem::Error, the next
//    time the host waits for the compute stream (any device-to-host copy, e.g. loss.item());
//  - the replay counter of the cuda::Graph capturing on a device, which random kernels (dropout)
//    read their seed with, so that each replay of a graph draws new numbers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

// Checks a cudaError_t-returning call. Clears the runtime's last-error slot before throwing so a
// stale error is never reported again by a later launch check.
#define TANDEM_CUDA_CHECK(expr)                                                                  \
  do {                                                                                           \
    const cudaError_t tandem_cuda_err_ = (expr);                                                 \
    if (tandem_cuda_err_ != cudaSuccess) [[unlikely]] {                                          \
      (void)cudaGetLastError();                                                                  \
      TANDEM_FAIL(#expr, " failed: ", cudaGetErrorName(tandem_cuda_err_), ": ",                  \
                  cudaGetErrorString(tandem_cuda_err_));                                         \
    }                                                                                            \
  } while (0)

// Checks the launch of the kernel just queued (bad configuration, no kernel image for this GPU).
#define TANDEM_CUDA_CHECK_LAUNCH() TANDEM_CUDA_CHECK(cudaGetLastError())

namespace tandem::cuda {

// Throws unless 0 <= device < cuda_device_count(), naming the device, the count and, when the
// runtime could not be initialised, its error (e.g. cudaErrorInsufficientDriver).
void check_device_index(int device);

// Makes `device` the calling thread's current device for good (cudaSetDevice). Call it once when
// a process picks its device, before creating streams or communicators, so that work the runtime
// does on the "current" device (primary context creation, library handles) lands on that device.
void set_device(int device);

// Makes `device` current for the scope and restores the previous current device after. A failed
// restore in the destructor clears the runtime's error slot so no later check reports it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The compute stream of a device (created on first use, lives for the process). Work queued on it
// by hand must run under a guard for `device` (prefer StreamGuard, which holds both).
cudaStream_t compute_stream(int device);

// The device made current for the scope, and its compute stream: what every kernel launch needs.
class StreamGuard {
 public:
  explicit StreamGuard(int device) : device_(device), guard_(device), stream_(compute_stream(device)) {}
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  int device_;
  DeviceGuard guard_;
  cudaStream_t stream_;
};

// Blocks the host until `stream` (or the current device) has finished its queued work, counting one
// host synchronisation. The only callers of cudaStreamSynchronize / cudaDeviceSynchronize.
void stream_synchronize(cudaStream_t stream);
void device_synchronize();
// Counts one host synchronisation made some other way (e.g. polling an event until it completes).
void note_host_sync();
// Counts one host-to-device copy.
void note_host_upload();

// Grid for a grid-stride loop over n elements (n > 0) with `block` threads per block.
inline unsigned grid_for(int64_t n, int block = 256) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

// ---- deferred kernel errors ----

enum KernelErrorCode : int {
  kNoKernelError = 0,
  kNllTargetOutOfRange = 1,    // a: row, b: target value, c: number of classes
  kIndexOutOfRange = 2,        // op: a KernelErrorOp; a: position in the index, b: value, c: size
  kClassTargetOutOfRange = 3,  // cross_entropy; a: position, b: target value, c: number of classes
};

// Which op wrote a kIndexOutOfRange record (names in wait_and_check_kernel_errors).
enum KernelErrorOp : int { kOpIndexSelect = 0, kOpIndexAdd = 1, kOpGather = 2, kOpScatterAdd = 3 };

// Written by a kernel that detects bad input: the first writer claims `code` with atomicCAS and
// fills op, a, b, c (see KernelErrorCode). report_kernel_error (core/cuda/launch.cuh) writes it.
struct KernelErrorRecord {
  int code;
  int op;
  long long a, b, c;
};

// The device's record (device memory, zeroed on the compute stream when both are created, so ahead
// of every kernel queued there; create it outside any graph capture, e.g. with
// prepare_kernel_error_record). Call mark_kernel_error_check_pending after queueing a kernel that
// may write it.
KernelErrorRecord* kernel_error_record(int device);
void prepare_kernel_error_record(int device);
void mark_kernel_error_check_pending(int device);
// How many times mark_kernel_error_check_pending was called for `device`: cuda::Graph compares it
// before and after a capture to learn whether the captured work may report, and if so re-arms the
// check after every replay.
uint64_t kernel_error_marks(int device);
// Waits for the device's compute stream (one counted host synchronisation) and, if a kernel that may
// report was queued since the last check, reads the record in that same wait, clears it, and throws
// tandem::Error describing the first error found. Every device-to-host copy (after queueing its copy)
// and synchronize(device) end with it; cuda::Graph::replay's callers reach it through them (a replay
// re-arms the check).
void wait_and_check_kernel_errors(int device);

// ---- random kernels under graph capture ----

// A replayed graph reruns its kernels with the arguments they were captured with, so a random
// kernel captured with its seed as an argument would repeat one draw on every replay. Instead, as
// PyTorch's philox seed and offset read by at::cuda::philox::unpack, a cuda::Graph keeps a replay
// counter in device memory (0 before the first replay), which the graph's last kernel advances by
// one on every replay, and registers it while it captures; a random kernel captured then takes the
// counter's address and mixes the value it reads with its captured draw
// (kernels/pointwise_math.h: dropout_seed).
// The counter of the cuda::Graph capturing on `device`'s compute stream (marking it read, so the
// graph adds the advancing kernel); null when that stream is not capturing. Throws when the stream
// is capturing but not for a cuda::Graph: nothing would advance a counter between replays.
const uint64_t* capture_replay_counter(int device);
// cuda::Graph's side: registers `counter` for the capture it opens (null: the capture ended).
// Returns whether capture_replay_counter handed out the counter being replaced.
bool set_capture_replay_counter(int device, uint64_t* counter);
// Queues on `device`'s compute stream one single-thread kernel that adds 1 to *counter (the last
// node of a graph whose captured work read the counter).
void queue_replay_counter_advance(int device, uint64_t* counter);

}  // namespace tandem::cuda
