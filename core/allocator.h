// Allocators. The host allocator hands out 64-byte aligned blocks and keeps
// freed blocks in per-size free lists, so a training step that allocates the
// same shapes every iteration reaches a steady state with no calls to the
// system allocator. The CUDA allocator does the same
// per device (core/cuda/runtime.cpp); without CUDA, asking for it throws.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/device.h"

namespace tandem {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  // Returns cached blocks to the system.
  virtual void empty_cache() {}
  // Bytes currently handed out and bytes held in the cache.
  virtual size_t allocated_bytes() const = 0;
  virtual size_t cached_bytes() const = 0;
};

// The caching both allocators share: a request is rounded up to a size class
// (512 B steps up to 1 MiB, 64 KiB steps up to 16 MiB, 2 MiB steps above) and
// served by the smallest cached block of at least that class and at most
// twice it (so a short last batch reuses a full batch's blocks instead of
// caching a second set); on a miss the backend allocates; when the backend is
// out of memory every cached block is released and the request retried once,
// then out_of_memory() throws. Thread-safe.
class CachingAllocator : public Allocator {
 public:
  static size_t size_class(size_t nbytes);

  void* allocate(size_t nbytes) final;
  void deallocate(void* ptr, size_t nbytes) final;
  void empty_cache() final;
  size_t allocated_bytes() const final;
  size_t cached_bytes() const final;

 protected:
  // nullptr when out of memory (other failures throw).
  virtual void* backend_allocate(size_t bytes) = 0;
  virtual void backend_release(const std::vector<void*>& blocks) = 0;
  [[noreturn]] virtual void out_of_memory(size_t nbytes, size_t rounded) = 0;

 private:
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;       // block size -> cached blocks
  std::unordered_map<void*, size_t> block_size_;    // blocks handed out -> their size
  size_t allocated_ = 0;
  size_t cached_ = 0;
};

Allocator& host_allocator();
Allocator& cuda_allocator(int device);
Allocator& allocator_for(Device device);

}  // namespace tandem
