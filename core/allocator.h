// Allocators. The host allocator hands out 64-byte aligned blocks and keeps
// freed blocks in per-size free lists, so a training step that allocates the
// same shapes every iteration reaches a steady state with no calls to the
// system allocator. The CUDA allocator does the same
// per device (core/cuda/runtime.cpp); without CUDA, asking for it throws.
#pragma once

#include <cstddef>
#include <map>
#include <cstdint>
#include <mutex>
#include <thread>
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
//
// Private pools (CUDA graph capture, as PyTorch's graph pools): between begin_private_pool() and
// end_private_pool(), allocations made by the thread that began the pool are served from, and
// their blocks return to, that pool only: never the shared free lists, never empty_cache(). A
// captured graph keeps the raw addresses it was recorded with, so every block it touched must stay
// reserved for its replays, even after the tensor that owned it was freed; the pool holds them
// until release_private_pool(), which hands them to the shared lists (blocks still in use join them
// when freed). Inside a pool a miss goes to the backend once, without emptying the cache (that
// would synchronise the device, which a capture forbids).
class CachingAllocator : public Allocator {
 public:
  using PoolId = uint64_t;
  static size_t size_class(size_t nbytes);

  // Starts a private pool for the calling thread (one at a time per allocator) and returns its id.
  PoolId begin_private_pool();
  // The calling thread allocates from the shared lists again; the pool keeps its blocks.
  void end_private_pool();
  // The pool's cached blocks go to the shared free lists, and its blocks still handed out will go
  // there when freed. The caller guarantees no queued work uses them (cuda::Graph::reset waits for
  // the stream first). Unknown or already released ids are ignored.
  void release_private_pool(PoolId id);
  // Bytes a private pool holds (handed out or cached): for tests and logs.
  size_t private_pool_bytes(PoolId id) const;

  void* allocate(size_t nbytes) final;
  void deallocate(void* ptr, size_t nbytes) final;
  void empty_cache() final;
  size_t allocated_bytes() const final;
  size_t cached_bytes() const final;
  // The most bytes handed out at once since construction or the last reset_peak_allocated() (which
  // sets it to what is handed out now), as torch.cuda.max_memory_allocated / reset_peak_memory_stats.
  size_t peak_allocated_bytes() const;
  void reset_peak_allocated();

 protected:
  // nullptr when out of memory (other failures throw).
  virtual void* backend_allocate(size_t bytes) = 0;
  virtual void backend_release(const std::vector<void*>& blocks) = 0;
  [[noreturn]] virtual void out_of_memory(size_t nbytes, size_t rounded) = 0;

 private:
  struct Block {
    size_t size;
    PoolId pool;  // 0: the shared lists
  };
  struct PrivatePool {
    std::map<size_t, std::vector<void*>> free;
    size_t bytes = 0;  // every block of the pool, handed out or cached
  };
  // Requires mu_. A cached block of at least cls and at most 2 * cls from `lists`, or nullptr.
  static void* take_cached(std::map<size_t, std::vector<void*>>& lists, size_t cls, size_t& size);
  PoolId active_pool_for_caller() const;

  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;       // block size -> cached blocks (shared)
  std::unordered_map<void*, Block> blocks_;         // blocks handed out -> their size and pool
  std::map<PoolId, PrivatePool> pools_;             // live private pools
  PoolId active_pool_ = 0;                          // the pool being filled, 0 if none
  std::thread::id active_thread_;                   // the thread that fills it
  PoolId next_pool_ = 1;
  size_t allocated_ = 0;
  size_t peak_allocated_ = 0;
  size_t cached_ = 0;
};

CachingAllocator& host_allocator();
CachingAllocator& cuda_allocator(int device);
Allocator& allocator_for(Device device);

}  // namespace tandem
