#include "core/allocator.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace tandem {
namespace {

constexpr size_t kAlignment = 64;

// Rounds a request up to a size class: multiples of 512 bytes up to 1 MiB,
// then multiples of 64 KiB, so blocks of nearby sizes are shared.
size_t size_class(size_t n) {
  if (n == 0) n = 1;
  const size_t quantum = n <= (1u << 20) ? 512 : (64u << 10);
  return (n + quantum - 1) / quantum * quantum;
}

class CachingHostAllocator final : public Allocator {
 public:
  ~CachingHostAllocator() override { empty_cache(); }

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
    void* p = std::aligned_alloc(kAlignment, cls);
    if (!p) {
      empty_cache();
      p = std::aligned_alloc(kAlignment, cls);
    }
    TANDEM_CHECK(p != nullptr, "out of host memory allocating ", nbytes, " bytes");
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
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    cached_ = 0;
  }

  size_t allocated_bytes() const override { return allocated_; }
  size_t cached_bytes() const override { return cached_; }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t allocated_ = 0;
  size_t cached_ = 0;
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
