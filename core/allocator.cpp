#include "core/allocator.h"

#include <algorithm>
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

void* CachingAllocator::take_cached(std::map<size_t, std::vector<void*>>& lists, size_t cls, size_t& size) {
  for (auto it = lists.lower_bound(cls); it != lists.end() && it->first <= 2 * cls; ++it) {
    if (it->second.empty()) continue;  // kept: its vector is reused when blocks come back
    void* p = it->second.back();
    it->second.pop_back();
    size = it->first;
    return p;
  }
  return nullptr;
}

CachingAllocator::PoolId CachingAllocator::active_pool_for_caller() const {
  return active_pool_ != 0 && active_thread_ == std::this_thread::get_id() ? active_pool_ : 0;
}

void* CachingAllocator::allocate(size_t nbytes) {
  const size_t cls = size_class(nbytes);
  PoolId pool = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool = active_pool_for_caller();
    size_t size = 0;
    void* p = take_cached(pool ? pools_[pool].free : free_, cls, size);
    if (p) {
      if (!pool) cached_ -= size;
      allocated_ += size;
      peak_allocated_ = std::max(peak_allocated_, allocated_);
      blocks_[p] = Block{size, pool};
      return p;
    }
  }
  void* p = backend_allocate(cls);
  if (!p && !pool) {  // inside a private pool (a capture) the device must not be synchronised
    empty_cache();
    p = backend_allocate(cls);
  }
  if (!p) out_of_memory(nbytes, cls);
  std::lock_guard<std::mutex> lock(mu_);
  allocated_ += cls;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  blocks_[p] = Block{cls, pool};
  if (pool) pools_[pool].bytes += cls;
  return p;
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  TANDEM_CHECK(it != blocks_.end(), "deallocate: ", ptr, " (", nbytes, " bytes) was not allocated here");
  const Block block = it->second;
  blocks_.erase(it);
  allocated_ -= block.size;
  auto pool = block.pool ? pools_.find(block.pool) : pools_.end();
  if (pool != pools_.end()) {
    pool->second.free[block.size].push_back(ptr);
    return;
  }
  free_[block.size].push_back(ptr);
  cached_ += block.size;
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

CachingAllocator::PoolId CachingAllocator::begin_private_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_CHECK(active_pool_ == 0, "CachingAllocator: private pool ", active_pool_,
               " is still being filled; end it before beginning another");
  const PoolId id = next_pool_++;
  pools_[id];
  active_pool_ = id;
  active_thread_ = std::this_thread::get_id();
  return id;
}

void CachingAllocator::end_private_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  active_pool_ = 0;
  active_thread_ = std::thread::id();
}

void CachingAllocator::release_private_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(id);
  if (it == pools_.end()) return;
  if (active_pool_ == id) {
    active_pool_ = 0;
    active_thread_ = std::thread::id();
  }
  for (auto& [size, list] : it->second.free) {
    for (void* p : list) free_[size].push_back(p);
    cached_ += size * list.size();
  }
  pools_.erase(it);  // blocks still handed out name a pool that no longer exists: freed to the shared lists
}

size_t CachingAllocator::private_pool_bytes(PoolId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(id);
  return it == pools_.end() ? 0 : it->second.bytes;
}

size_t CachingAllocator::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

size_t CachingAllocator::peak_allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_allocated_;
}

void CachingAllocator::reset_peak_allocated() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_allocated_ = allocated_;
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

CachingAllocator& host_allocator() {
  // Leaked on purpose: tensors in static storage may outlive any other static.
  static auto* alloc = new CachingHostAllocator();
  return *alloc;
}

Allocator& allocator_for(Device device) {
  return device.is_cpu() ? host_allocator() : cuda_allocator(device.index);
}

}  // namespace tandem
