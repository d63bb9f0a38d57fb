// The caching CUDA allocator (core/cuda/runtime.cpp): freed blocks are reused for requests of the
// same size class, the byte counters follow, empty_cache returns the cache to the driver, an
// impossible request throws a tandem::Error naming the size, and bad device indices are refused.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "core/allocator.h"
#include "core/device.h"
#include "core/tensor.h"
#include "gpu_test_util.h"

using namespace tandem;
using namespace tandem::gpu_test;

TEST(CudaAllocator, ReusesAFreedBlockOfTheSameSizeClass) {
  TANDEM_NEED_GPUS(1);
  EXPECT_TRUE(cuda_compiled());
  Allocator& a = cuda_allocator(0);
  a.empty_cache();
  EXPECT_EQ(a.cached_bytes(), 0u);
  const size_t before = a.allocated_bytes();
  void* p = a.allocate(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.allocated_bytes(), before + 1024);  // 1000 rounds up to a 512-byte multiple
  a.deallocate(p, 1000);
  EXPECT_EQ(a.allocated_bytes(), before);
  EXPECT_EQ(a.cached_bytes(), 1024u);
  void* q = a.allocate(900);  // same size class
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.cached_bytes(), 0u);
  void* r = a.allocate(5000);  // another class: a new block
  EXPECT_NE(r, p);
  a.deallocate(q, 900);
  a.deallocate(r, 5000);
  a.empty_cache();
  EXPECT_EQ(a.cached_bytes(), 0u);
  EXPECT_EQ(a.allocated_bytes(), before);
}

TEST(CudaAllocator, TensorsOfOneShapeReuseStorage) {
  TANDEM_NEED_GPUS(1);
  const void* first = nullptr;
  {
    Tensor t = Tensor::empty({64, 32, 26, 26}, kFloat32, gpu());
    first = t.raw_data();
  }
  Tensor again = Tensor::empty({64, 32, 26, 26}, kFloat32, gpu());
  EXPECT_EQ(again.raw_data(), first);
  // The reused block holds what the new owner writes, in stream order.
  again.fill_(2.5);
  for (float v : again.select(0, 63).select(0, 31).to_vector<float>()) ASSERT_EQ(v, 2.5f);
}

TEST(CudaAllocator, ImpossibleRequestThrowsNamingTheSize) {
  TANDEM_NEED_GPUS(1);
  Allocator& a = cuda_allocator(0);
  const size_t huge = size_t{1} << 50;  // 1 PiB
  EXPECT_TRUE(throws_with([&] { a.allocate(huge); }, {"cuda:0", std::to_string(huge)}));
  // The allocator and the device still work afterwards.
  void* p = a.allocate(4096);
  EXPECT_NE(p, nullptr);
  a.deallocate(p, 4096);
  EXPECT_TRUE(same(Tensor::full({5}, 1.5, kFloat32, gpu()), Tensor::full({5}, 1.5)));
}

TEST(CudaAllocator, RefusesDevicesThatAreNotVisible) {
  TANDEM_NEED_GPUS(1);
  const int count = cuda_device_count();
  EXPECT_TRUE(throws_with([&] { cuda_allocator(count); }, {"cuda:" + std::to_string(count), "visible"}));
  EXPECT_TRUE(throws_with([&] { cuda_allocator(-1); }, {"cuda:-1"}));
  EXPECT_TRUE(throws_with([&] { Tensor::empty({2}, kFloat32, Device::cuda(count)); }, {"visible"}));
}
