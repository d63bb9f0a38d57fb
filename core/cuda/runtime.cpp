// The CUDA side of core/device.h and core/allocator.h: device discovery and the caching device
// allocator (one per device).
//
// Allocator contract:
//  - A request is rounded up to a size class (512 B steps up to 1 MiB, 64 KiB steps up to 16 MiB,
//    2 MiB steps above) and served from that class's free list; on a miss it calls cudaMalloc.
//    On out-of-memory it returns every cached block to the driver and retries once, then throws
//    tandem::Error with the requested size and the device's usage.
//  - Stream assumption: a freed block goes back to the free list at once, while kernels queued
//    earlier may still be using it. That is safe because every user of device memory queues its
//    work on the device's single compute stream (core/cuda/context.h): the next owner's work is
//    queued after the previous owner's and so runs after it. Work on any other stream (NCCL's
//    communication stream) must keep its tensors alive until that work has completed, or make
//    the compute stream wait on an event recorded after it, before the tensors are dropped.
//  - Graph captures allocate from a private pool (core/allocator.h), so empty_cache() never frees
//    a block a captured graph's replays still write.
//  - empty_cache() waits for the device (cudaDeviceSynchronize) before cudaFree, since cached
//    blocks may still be in use by queued work; it is for out-of-memory recovery and tests, never
//    part of a training step.
//  - Allocators are created on first use and never destroyed (tensors in static storage may
//    outlive everything else, and cudaFree after the runtime's teardown would fail).
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/cuda/context.h"

namespace tandem {
namespace {

using cuda::DeviceGuard;

class CudaCachingAllocator final : public CachingAllocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device) {}

 protected:
  void* backend_allocate(size_t bytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    // Relaxed capture mode for this call, as PyTorch's allocator does: a miss inside a graph
    // capture (served into the capture's private pool) may then call cudaMalloc, which the
    // thread-local capture mode forbids. Outside a capture the mode change has no effect.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    TANDEM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t err = cudaMalloc(&p, bytes);
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (err == cudaSuccess) return p;
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation) return nullptr;
    TANDEM_FAIL("cudaMalloc failed on cuda:", device_, " allocating ", bytes, " bytes: ", cudaGetErrorName(err), ": ",
                cudaGetErrorString(err));
  }

  void backend_release(const std::vector<void*>& blocks) override {
    DeviceGuard guard(device_);
    cuda::device_synchronize();  // queued work may still use cached blocks
    for (void* p : blocks) TANDEM_CUDA_CHECK(cudaFree(p));
  }

  [[noreturn]] void out_of_memory(size_t nbytes, size_t rounded) override {
    size_t free_bytes = 0, total_bytes = 0;
    DeviceGuard guard(device_);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    TANDEM_FAIL("CUDA out of memory on cuda:", device_, " allocating ", nbytes, " bytes (", rounded,
                " after rounding); ", allocated_bytes(), " bytes held by tensors, ", free_bytes, " of ", total_bytes,
                " bytes free on the device");
  }

 private:
  const int device_;
};

}  // namespace

bool cuda_compiled() { return true; }

namespace {

struct DeviceCount {
  int count = 0;
  std::string reason;  // why count is 0 (cuda_unavailable_reason)
};

const DeviceCount& device_count() {
  // The runtime reads CUDA_VISIBLE_DEVICES once, at initialisation, so the count cannot change.
  static const DeviceCount found = [] {
    DeviceCount d;
    const cudaError_t err = cudaGetDeviceCount(&d.count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not an error here: callers see 0 devices and can ask why
      d.count = 0;
      d.reason = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      if (err == cudaErrorNoDevice && visible != nullptr)
        d.reason += std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")";
    } else if (d.count == 0) {
      d.reason = "the CUDA runtime reports 0 devices";
    }
    return d;
  }();
  return found;
}

}  // namespace

int cuda_device_count() { return device_count().count; }

std::string cuda_unavailable_reason() { return device_count().reason; }

void set_cuda_device(int index) { cuda::set_device(index); }

void synchronize(Device device) {
  if (device.is_cpu()) return;
  cuda::wait_and_check_kernel_errors(device.index);
}

CachingAllocator& cuda_allocator(int device) {
  cuda::check_device_index(device);
  static std::mutex mu;
  static auto* allocators = new std::vector<CudaCachingAllocator*>();  // leaked, see above
  std::lock_guard<std::mutex> lock(mu);
  if (allocators->empty()) allocators->resize(cuda_device_count(), nullptr);
  CudaCachingAllocator*& a = (*allocators)[device];
  if (!a) a = new CudaCachingAllocator(device);
  return *a;
}

}  // namespace tandem
