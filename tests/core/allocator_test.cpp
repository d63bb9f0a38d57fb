// CachingAllocator's private pools (what cuda::Graph captures allocate from), tested on a host
// backend that counts its calls: a captured graph keeps raw addresses, so the blocks its capture
// touched must never be handed to anyone else nor released by empty_cache() until the pool is
// released.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

namespace tandem {
namespace {

class CountingAllocator final : public CachingAllocator {
 public:
  int allocations = 0;
  std::vector<void*> released;
  bool refuse = false;  // the backend is "out of memory"

 protected:
  void* backend_allocate(size_t bytes) override {
    if (refuse) return nullptr;
    ++allocations;
    return std::malloc(bytes);
  }
  void backend_release(const std::vector<void*>& blocks) override {
    for (void* p : blocks) {
      released.push_back(p);
      std::free(p);
    }
  }
  [[noreturn]] void out_of_memory(size_t nbytes, size_t) override { TANDEM_FAIL("out of memory: ", nbytes); }
};

TEST(PrivatePool, BlocksFreedInsideThePoolStayInIt) {
  CountingAllocator a;
  const auto pool = a.begin_private_pool();
  void* temp = a.allocate(1000);  // a temporary of the captured step
  a.deallocate(temp, 1000);
  void* again = a.allocate(1000);  // the capture reuses it...
  EXPECT_EQ(again, temp);
  a.deallocate(again, 1000);
  a.end_private_pool();
  EXPECT_EQ(a.private_pool_bytes(pool), CachingAllocator::size_class(1000));

  void* other = a.allocate(1000);  // ...but nobody outside the capture does
  EXPECT_NE(other, temp);
  EXPECT_EQ(a.allocations, 2);
  a.deallocate(other, 1000);
  a.empty_cache();  // releases `other` only
  EXPECT_EQ(a.released, std::vector<void*>{other});

  a.release_private_pool(pool);  // the graph was reset: its blocks join the shared cache
  EXPECT_EQ(a.private_pool_bytes(pool), 0u);
  EXPECT_EQ(a.allocate(1000), temp);
  a.deallocate(temp, 1000);
  a.empty_cache();
  EXPECT_EQ(a.released.size(), 2u);
}

TEST(PrivatePool, BlocksStillHeldWhenThePoolIsReleasedGoToTheSharedCacheWhenFreed) {
  CountingAllocator a;
  const auto pool = a.begin_private_pool();
  void* output = a.allocate(4096);  // e.g. a gradient the captured step created and keeps
  a.end_private_pool();
  a.release_private_pool(pool);
  a.deallocate(output, 4096);
  EXPECT_EQ(a.cached_bytes(), CachingAllocator::size_class(4096));
  EXPECT_EQ(a.allocate(4096), output);
  a.deallocate(output, 4096);
  a.empty_cache();
  EXPECT_EQ(a.released, std::vector<void*>{output});
}

TEST(PrivatePool, OnlyTheThreadThatBeganThePoolFillsIt) {
  CountingAllocator a;
  void* shared = a.allocate(512);
  a.deallocate(shared, 512);
  const auto pool = a.begin_private_pool();
  void* from_other = nullptr;
  std::thread([&] { from_other = a.allocate(512); }).join();  // e.g. a loader thread during a capture
  EXPECT_EQ(from_other, shared);
  void* mine = a.allocate(512);
  EXPECT_NE(mine, shared);
  a.deallocate(from_other, 512);
  a.deallocate(mine, 512);
  a.end_private_pool();
  EXPECT_EQ(a.private_pool_bytes(pool), CachingAllocator::size_class(512));
  const auto second = a.begin_private_pool();
  EXPECT_THROW(a.begin_private_pool(), Error);  // one pool at a time
  a.end_private_pool();
  a.release_private_pool(second);
  a.release_private_pool(pool);
  a.empty_cache();
  EXPECT_EQ(a.released.size(), 2u);  // `shared` and `mine`: every block went back to the backend
}

TEST(PrivatePool, AMissInsideThePoolNeverEmptiesTheCache) {
  CountingAllocator a;
  void* cached = a.allocate(1 << 20);
  a.deallocate(cached, 1 << 20);
  const auto pool = a.begin_private_pool();
  a.refuse = true;
  // Outside a pool, out of memory empties the cache and retries; inside one (a capture) emptying
  // would synchronise the device, so the request fails at once, and the cache is untouched.
  EXPECT_THROW(a.allocate(2 << 20), Error);
  EXPECT_TRUE(a.released.empty());
  a.end_private_pool();
  a.release_private_pool(pool);
  EXPECT_THROW(a.allocate(2 << 20), Error);
  EXPECT_EQ(a.released, std::vector<void*>{cached});
}

// The peak the log line's `memory` reports on CUDA (as torch.cuda.max_memory_allocated): the most
// handed out at once, cache hits included, until reset_peak_allocated() lowers it to what is out now.
TEST(PeakAllocated, TracksTheMostHandedOutAtOnceAndResetsToWhatIsOutNow) {
  CountingAllocator a;
  const size_t c1 = CachingAllocator::size_class(1000), c2 = CachingAllocator::size_class(3000);
  void* p = a.allocate(1000);
  void* q = a.allocate(3000);
  EXPECT_EQ(a.peak_allocated_bytes(), c1 + c2);
  a.deallocate(q, 3000);
  EXPECT_EQ(a.peak_allocated_bytes(), c1 + c2);  // freeing does not lower the peak
  a.reset_peak_allocated();
  EXPECT_EQ(a.peak_allocated_bytes(), c1);
  q = a.allocate(3000);  // served from the cache: still counted
  EXPECT_EQ(a.allocations, 2);
  EXPECT_EQ(a.peak_allocated_bytes(), c1 + c2);
  a.deallocate(q, 3000);
  a.deallocate(p, 1000);
  a.reset_peak_allocated();
  EXPECT_EQ(a.peak_allocated_bytes(), 0u);
  a.empty_cache();  // the backend frees the cached blocks
  EXPECT_EQ(a.released.size(), 2u);
}

}  // namespace
}  // namespace tandem
