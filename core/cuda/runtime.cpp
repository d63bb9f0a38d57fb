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
//    work on the device's single compute stream (kernels/cuda/context.h): the next owner's work is
//    queued after the previous owner's and so runs after it. Work on any other stream (NCCL's
//    communication stream) must keep its tensors alive until that work has completed, or make
//    the compute stream wait on an event recorded after it, before the tensors are dropped.
//  - empty_cache() waits for the device (cudaDeviceSynchronize) before cudaFree, since cached
//    blocks may still be in use by queued work; it is for out-of-memory recovery and tests, never
//    part of a training step.
//  - Allocators are created on first use and never destroyed (tensors in static storage may
//    outlive everything else, and cudaFree after the runtime's teardown would fail).
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/context.h"

namespace tandem {
namespace {

using kernels::cuda::DeviceGuard;

size_t size_class(size_t n) {
  if (n == 0) n = 1;
  size_t quantum;
  if (n <= (size_t{1} << 20)) {
    quantum = 512;
  } else if (n <= (size_t{16} << 20)) {
    quantum = size_t{64} << 10;
  } else {
    quantum = size_t{2} << 20;
  }
  return (n + quantum - 1) / quantum * quantum;
}

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device) {}

  void* allocate(size_t nbytes) override {
    const size_t cls = size_class(nbytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= cls;
        allocated_ += cls;
        return p;
      }
    }
    DeviceGuard guard(device_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, cls);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      empty_cache();
      err = cudaMalloc(&p, cls);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
      TANDEM_FAIL(err == cudaErrorMemoryAllocation ? "CUDA out of memory" : "cudaMalloc failed", " on cuda:",
                  device_, " allocating ", nbytes, " bytes (", cls, " after rounding): ", cudaGetErrorName(err),
                  ": ", cudaGetErrorString(err), "; ", allocated_bytes(), " bytes held by tensors, ",
                  free_bytes, " of ", total_bytes, " bytes free on the device");
    }
    std::lock_guard<std::mutex> lock(mu_);
    allocated_ += cls;
    return p;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    const size_t cls = size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_[cls].push_back(ptr);
    allocated_ -= cls;
    cached_ += cls;
  }

  void empty_cache() override {
    std::unordered_map<size_t, std::vector<void*>> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks.swap(free_);
      cached_ = 0;
    }
    if (blocks.empty()) return;
    DeviceGuard guard(device_);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [cls, list] : blocks)
      for (void* p : list) TANDEM_CUDA_CHECK(cudaFree(p));
  }

  size_t allocated_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return allocated_;
  }
  size_t cached_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  const int device_;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t allocated_ = 0;
  size_t cached_ = 0;
};

}  // namespace

bool cuda_compiled() { return true; }

int cuda_device_count() {
  // The runtime reads CUDA_VISIBLE_DEVICES once, at initialisation, so the count cannot change.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver, no device, CUDA_VISIBLE_DEVICES=-1: not an error here
      return 0;
    }
    return n;
  }();
  return count;
}

Allocator& cuda_allocator(int device) {
  kernels::cuda::check_device_index(device);
  static std::mutex mu;
  static auto* allocators = new std::vector<CudaCachingAllocator*>();  // leaked, see above
  std::lock_guard<std::mutex> lock(mu);
  if (allocators->empty()) allocators->resize(cuda_device_count(), nullptr);
  CudaCachingAllocator*& a = (*allocators)[device];
  if (!a) a = new CudaCachingAllocator(device);
  return *a;
}

}  // namespace tandem
