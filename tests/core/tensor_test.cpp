#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/tensor.h"

using namespace tandem;

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor tr = t.transpose(0, 1);
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.contiguous().to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{2, 3, 5, 6}));
  s.fill_(0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 0, 0, 4, 0, 0}));
}

TEST(CachingAllocator, ASmallerRequestReusesACachedBlockUpToTwiceItsSize) {
  Allocator& a = host_allocator();
  // Sizes no other test in this process uses: 3 MiB classes.
  const size_t big = size_t{3} << 20, smaller = (size_t{3} << 20) * 3 / 4, tiny = size_t{1} << 20;
  void* p = a.allocate(big);
  a.deallocate(p, big);
  void* q = a.allocate(smaller);  // within 2x: the cached 3 MiB block comes back
  EXPECT_EQ(q, p);
  a.deallocate(q, smaller);
  void* r = a.allocate(tiny);  // 3x smaller: a block of its own, the 3 MiB one stays cached
  EXPECT_NE(r, p);
  const size_t cached = a.cached_bytes();
  EXPECT_GE(cached, big);
  a.deallocate(r, tiny);
  EXPECT_EQ(a.cached_bytes(), cached + CachingAllocator::size_class(tiny));
}
