#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

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

// int64 counters add in place (BatchNorm's num_batches_tracked counts this way on any device); a
// fractional alpha has no int64 meaning and is refused, naming it.
TEST(Tensor, AddInPlaceOnInt64) {
  Tensor t = Tensor::from_vector<int64_t>({5, -2}, {2});
  const void* before = t.raw_data();
  t.add_(Tensor::from_vector<int64_t>({1, 3}, {2}), 2.0);
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{7, 4}));
  EXPECT_EQ(t.raw_data(), before);
  try {
    t.add_(Tensor::from_vector<int64_t>({1, 1}, {2}), 0.5);
    ADD_FAILURE() << "a fractional alpha on int64 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("alpha must be a whole number for int64 tensors, got 0.5"), std::string::npos)
        << e.what();
  }
}

// A float add_ of 2^16 elements or more is cut into slices over the kernel pool: every element is
// d + alpha * o, whatever the thread count (an odd length: the slices are uneven).
TEST(Tensor, AddInPlaceOverThreadsIsElementwise) {
  const int64_t n = (int64_t{1} << 17) + 3;
  for (DType dtype : {kFloat32, kFloat64}) {
    std::vector<double> a(n), b(n);
    for (int64_t i = 0; i < n; ++i) {
      a[i] = 0.001 * double(i % 977) - 0.3;
      b[i] = 1.0 / double(1 + i % 13);
    }
    const Tensor src = Tensor::from_vector<double>(b, {n}).to(dtype);
    const int before = num_threads();
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      Tensor t = Tensor::from_vector<double>(a, {n}).to(dtype);
      t.add_(src, 0.5);
      if (dtype == kFloat32) {
        const std::vector<float> got = t.to_vector<float>(), y = src.to_vector<float>();
        const std::vector<float> x = Tensor::from_vector<double>(a, {n}).to(dtype).to_vector<float>();
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], x[i] + 0.5f * y[i]) << threads << " threads, element " << i;
      } else {
        const std::vector<double> got = t.to_vector<double>();
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], a[i] + 0.5 * b[i]) << threads << " threads, element " << i;
      }
    }
    set_num_threads(before);
  }
}

// Host tensors never block on a device: reading values, copies and synchronize(cpu) leave the
// host-sync and upload counters where they were.
TEST(Tensor, HostWorkNeverCountsAsADeviceSynchronisation) {
  const uint64_t syncs = cuda::host_sync_count(), uploads = cuda::host_upload_count();
  Tensor t = Tensor::ones({3});
  Tensor u = t.to(Device::cpu()).clone();
  u.copy_(t);
  EXPECT_EQ(u.to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(Tensor::scalar(2.5).item<double>(), 2.5);
  synchronize(Device::cpu());
  EXPECT_EQ(cuda::host_sync_count(), syncs);
  EXPECT_EQ(cuda::host_upload_count(), uploads);
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
