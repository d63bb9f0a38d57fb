// Allocators. The host allocator hands out 64-byte aligned blocks and keeps
// freed blocks in per-size free lists, so a training step that allocates the
// same shapes every iteration reaches a steady state with no calls to the
// system allocator. The CUDA allocator does the same
// per device (core/cuda/runtime.cpp); without CUDA, asking for it throws.
#pragma once

#include <cstddef>

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

Allocator& host_allocator();
Allocator& cuda_allocator(int device);
Allocator& allocator_for(Device device);

}  // namespace tandem
