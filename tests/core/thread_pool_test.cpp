// The kernels' thread pool (core/thread_pool.h) under both of its ways of waiting: spinning briefly
// before sleeping (the default) and sleeping at once (OMP_WAIT_POLICY=passive, read when the pool is
// built). Thousands of back-to-back regions, as a training step runs them: every index runs exactly
// once per region, an exception from any chunk reaches the caller, and the pool keeps working after.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

using namespace tandem;

namespace {

// Rebuilds the pool with `threads` threads under `policy` (nullptr: unset) and restores both after.
class PoolUnderPolicy {
 public:
  PoolUnderPolicy(const char* policy, int threads) : saved_threads_(num_threads()) {
    if (const char* old = std::getenv("OMP_WAIT_POLICY")) saved_policy_ = old;
    if (policy) {
      setenv("OMP_WAIT_POLICY", policy, 1);
    } else {
      unsetenv("OMP_WAIT_POLICY");
    }
    set_num_threads(threads == 1 ? 2 : 1);  // a different size, so the next call builds a new pool
    set_num_threads(threads);
  }
  ~PoolUnderPolicy() {
    if (saved_policy_.empty()) {
      unsetenv("OMP_WAIT_POLICY");
    } else {
      setenv("OMP_WAIT_POLICY", saved_policy_.c_str(), 1);
    }
    set_num_threads(saved_threads_ == 1 ? 2 : 1);
    set_num_threads(saved_threads_);
  }

 private:
  int saved_threads_;
  std::string saved_policy_;
};

}  // namespace

TEST(ThreadPool, BackToBackRegionsRunEveryIndexOnceUnderBothWaitPolicies) {
  for (const char* policy : {static_cast<const char*>(nullptr), "passive"}) {
    for (int threads : {2, 3}) {
      SCOPED_TRACE(std::string(policy ? policy : "default") + ", threads " + std::to_string(threads));
      PoolUnderPolicy pool(policy, threads);
      constexpr int64_t kItems = 97;
      std::vector<std::atomic<int>> hits(kItems);
      for (int region = 0; region < 3000; ++region) {
        parallel_for(0, kItems, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
        });
      }
      for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(hits[i].load(), 3000) << "index " << i;

      // A throwing chunk (the last one, on a worker) reaches the caller; the next region still runs.
      EXPECT_THROW(parallel_for(0, kItems, 1,
                                [&](int64_t, int64_t e) {
                                  if (e == kItems) throw std::runtime_error("chunk failed");
                                }),
                   std::runtime_error);
      std::atomic<int64_t> sum{0};
      parallel_for(0, kItems, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sum += i;
      });
      EXPECT_EQ(sum.load(), kItems * (kItems - 1) / 2);
    }
  }
}
