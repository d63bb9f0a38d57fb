// Per-device CUDA state: compute streams, the device guards, the deferred kernel-error record and the
// replay counter of the graph being captured.
// See context.h for the contract. Streams and records live for the whole process on purpose:
// destroying them from static destructors would race the CUDA runtime's own teardown.
#include "core/cuda/context.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "core/device.h"  // host_sync_count, host_upload_count

namespace tandem::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct PerDevice {
  std::once_flag once;
  cudaStream_t stream = nullptr;
  KernelErrorRecord* record = nullptr;  // made with the stream: never inside a graph capture
  std::atomic<bool> error_check_pending{false};
  std::atomic<uint64_t> error_marks{0};
  std::atomic<uint64_t*> replay_counter{nullptr};  // of the cuda::Graph capturing on the device
  std::atomic<bool> replay_counter_read{false};     // handed out during that capture
};

std::atomic<uint64_t> g_host_syncs{0};
std::atomic<uint64_t> g_host_uploads{0};

std::array<PerDevice, kMaxDevices>& per_device() {
  static auto* state = new std::array<PerDevice, kMaxDevices>();  // leaked, see the file comment
  return *state;
}

// The stream and the error record of `device`, made once under a guard. The record is zeroed by
// the first work queued on the compute stream itself, so every kernel queued there after it sees
// the zeros: a plain cudaMemset would run on the legacy default stream, which the non-blocking
// compute stream does not wait for.
PerDevice& ready_device(int device) {
  check_device_index(device);
  PerDevice& pd = per_device()[device];
  std::call_once(pd.once, [&] {
    DeviceGuard guard(device);
    cudaStream_t s = nullptr;
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void* p = nullptr;
    TANDEM_CUDA_CHECK(cudaMalloc(&p, sizeof(KernelErrorRecord)));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(KernelErrorRecord), s));
    pd.record = static_cast<KernelErrorRecord*>(p);
    pd.stream = s;
  });
  return pd;
}

}  // namespace

void check_device_index(int device) {
  const int count = tandem::cuda_device_count();
  if (!(device >= 0 && device < count)) {
    const std::string why = cuda_unavailable_reason();
    TANDEM_FAIL("CUDA device cuda:", device, " requested but ", count, " device(s) are visible",
                count == 0 ? " (" + (why.empty() ? std::string("no GPU") : why) + ")" : std::string());
  }
  TANDEM_CHECK(device < kMaxDevices, "CUDA device index ", device, " above the supported maximum ",
               kMaxDevices - 1);
}

void set_device(int device) {
  check_device_index(device);
  TANDEM_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::DeviceGuard(int device) {
  TANDEM_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    TANDEM_CUDA_CHECK(cudaSetDevice(device));
  } else {
    previous_ = -1;  // nothing to restore
  }
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; a failed restore must not linger in the runtime's error slot,
  // where the next launch check would report it as its own.
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

void note_host_sync() { g_host_syncs.fetch_add(1, std::memory_order_relaxed); }

void note_host_upload() { g_host_uploads.fetch_add(1, std::memory_order_relaxed); }

void stream_synchronize(cudaStream_t stream) {
  note_host_sync();
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void device_synchronize() {
  note_host_sync();
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
}

uint64_t host_sync_count() { return g_host_syncs.load(std::memory_order_relaxed); }

uint64_t host_upload_count() { return g_host_uploads.load(std::memory_order_relaxed); }

cudaStream_t compute_stream(int device) { return ready_device(device).stream; }

KernelErrorRecord* kernel_error_record(int device) { return ready_device(device).record; }

void prepare_kernel_error_record(int device) { (void)ready_device(device); }

void mark_kernel_error_check_pending(int device) {
  PerDevice& pd = per_device()[device];
  pd.error_marks.fetch_add(1, std::memory_order_relaxed);
  pd.error_check_pending.store(true, std::memory_order_release);
}

uint64_t kernel_error_marks(int device) {
  if (device < 0 || device >= kMaxDevices) return 0;
  return per_device()[device].error_marks.load(std::memory_order_relaxed);
}

const uint64_t* capture_replay_counter(int device) {
  PerDevice& pd = ready_device(device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TANDEM_CUDA_CHECK(cudaStreamIsCapturing(pd.stream, &status));
  if (status != cudaStreamCaptureStatusActive) return nullptr;
  uint64_t* counter = pd.replay_counter.load(std::memory_order_acquire);
  TANDEM_CHECK(counter != nullptr, "a random kernel (dropout) is being captured on cuda:", device,
               " by a CUDA graph capture that cuda::Graph did not open: nothing would advance its seed between "
               "replays, so every replay would repeat one mask; capture with cuda::Graph (as --cuda-graph does)");
  pd.replay_counter_read.store(true, std::memory_order_release);
  return counter;
}

bool set_capture_replay_counter(int device, uint64_t* counter) {
  PerDevice& pd = per_device()[device];
  pd.replay_counter.store(counter, std::memory_order_release);
  return pd.replay_counter_read.exchange(false, std::memory_order_acq_rel);
}

void wait_and_check_kernel_errors(int device) {
  KernelErrorRecord host{};
  {
    StreamGuard on(device);
    PerDevice& pd = per_device()[device];
    const bool pending = pd.error_check_pending.exchange(false, std::memory_order_acq_rel);
    if (pending) {  // queued behind the caller's work, so read in the same wait
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(&host, pd.record, sizeof(host), cudaMemcpyDeviceToHost, on.stream()));
    }
    stream_synchronize(on.stream());
    if (!pending || host.code == kNoKernelError) return;
    TANDEM_CUDA_CHECK(cudaMemsetAsync(pd.record, 0, sizeof(KernelErrorRecord), on.stream()));
  }
  const std::string where = " (found by a CUDA kernel on cuda:" + std::to_string(device) +
                            "; reported at the next read of a result from that device)";
  switch (host.code) {
    case kNllTargetOutOfRange:
      TANDEM_FAIL("nll_loss (cross_entropy's too): target ", host.b, " at row ", host.a,
                  " is out of range, expected a class in [0, ", host.c, ") or ignore_index", where);
    case kIndexOutOfRange: {
      static const char* const names[] = {"index_select", "index_add", "gather", "scatter_add"};
      const char* op = host.op >= 0 && host.op < 4 ? names[host.op] : "an index op";
      TANDEM_FAIL(op, ": index ", host.b, " at position ", host.a, " is out of range for a dimension of size ",
                  host.c, " (expected 0 <= index < ", host.c, ")", where);
    }
    case kClassTargetOutOfRange:
      TANDEM_FAIL("nll_loss (cross_entropy's too): target ", host.b, " at position ", host.a, " is out of range for ",
                  host.c, " classes (expected 0 <= target < ", host.c, " or ignore_index)", where);
    default:
      TANDEM_FAIL("a CUDA kernel on cuda:", device, " reported error code ", host.code);
  }
}

}  // namespace tandem::cuda
