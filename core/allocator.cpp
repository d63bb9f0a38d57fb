#include "core/allocator.h"

#include <cstdlib>

#include "core/error.h"

namespace tandem {

size_t CachingAllocator::size_class(size_t n) {
  if (n == 0) n = 1;
  size_t quantum = size_t{2} << 20;
  if (n <= (size_t{1} << 20))
    quantum = 512;
  else if (n <= (size_t{16} << 20))
    quantum = size_t{64} << 10;
  return (n + quantum - 1) / quantum * quantum;
}

void* CachingAllocator::allocate(size_t nbytes) {
  const size_t cls = size_class(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.lower_bound(cls); it != free_.end() && it->first <= 2 * cls; ++it) {
      if (it->second.empty()) continue;  // kept: its vector is reused when blocks come back
      void* p = it->second.back();
      it->second.pop_back();
      cached_ -= it->first;
      allocated_ += it->first;
      block_size_[p] = it->first;
      return p;
    }
  }
  void* p = backend_allocate(cls);
  if (!p) {
    empty_cache();
    p = backend_allocate(cls);
  }
  if (!p) out_of_memory(nbytes, cls);
  std::lock_guard<std::mutex> lock(mu_);
  allocated_ += cls;
  block_size_[p] = cls;
  return p;
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = block_size_.find(ptr);
  TANDEM_CHECK(it != block_size_.end(), "deallocate: ", ptr, " (", nbytes, " bytes) was not allocated here");
  const size_t size = it->second;
  block_size_.erase(it);
  free_[size].push_back(ptr);
  allocated_ -= size;
  cached_ += size;
}

void CachingAllocator::empty_cache() {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, list] : free_) blocks.insert(blocks.end(), list.begin(), list.end());
    free_.clear();
    cached_ = 0;
  }
  if (!blocks.empty()) backend_release(blocks);
}

size_t CachingAllocator::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

size_t CachingAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

namespace {

constexpr size_t kAlignment = 64;

class CachingHostAllocator final : public CachingAllocator {
 protected:
  void* backend_allocate(size_t bytes) override { return std::aligned_alloc(kAlignment, bytes); }
  void backend_release(const std::vector<void*>& blocks) override {
    for (void* p : blocks) std::free(p);
  }
  [[noreturn]] void out_of_memory(size_t nbytes, size_t rounded) override {
    TANDEM_FAIL("out of host memory allocating ", nbytes, " bytes (", rounded, " after rounding)");
  }
};

}  // namespace

Allocator& host_allocator() {
  // Leaked on purpose: tensors in static storage may outlive any other static.
  static auto* alloc = new CachingHostAllocator();
  return *alloc;
}

Allocator& allocator_for(Device device) {
  return device.is_cpu() ? host_allocator() : cuda_allocator(device.index);
}

}  // namespace tandem
