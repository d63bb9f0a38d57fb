// Samplers: sequential order, and RandomSampler's defining properties: a
// permutation, a pure function of (seed, epoch), equal to Fisher-Yates driven
// by Generator(seed + epoch).below().
#include "data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/random.h"

using namespace tandem;
using data::RandomSampler;
using data::SequentialSampler;

TEST(Sampler, Sequential) {
  SequentialSampler s(5);
  EXPECT_EQ(s.size(), 5);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  s.set_epoch(3);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(SequentialSampler(0).indices().empty());
  EXPECT_THROW(SequentialSampler(-1), Error);
}

TEST(Sampler, RandomIsAPermutation) {
  for (int64_t n : {1, 2, 3, 10, 1000}) {
    RandomSampler s(n, 42);
    for (int64_t epoch : {0, 1, 7}) {
      s.set_epoch(epoch);
      std::vector<int64_t> p = s.indices();
      ASSERT_EQ(static_cast<int64_t>(p.size()), n);
      std::sort(p.begin(), p.end());
      std::vector<int64_t> expect(n);
      std::iota(expect.begin(), expect.end(), 0);
      EXPECT_EQ(p, expect) << "n=" << n << " epoch=" << epoch;
    }
  }
  EXPECT_TRUE(RandomSampler(0, 1).indices().empty());
}

TEST(Sampler, RandomIsDeterministicPerSeedAndEpoch) {
  RandomSampler a(500, 123), b(500, 123), c(500, 124);
  EXPECT_EQ(a.indices(), b.indices());
  EXPECT_NE(a.indices(), c.indices());
  const std::vector<int64_t> e0 = a.indices();
  a.set_epoch(1);
  const std::vector<int64_t> e1 = a.indices();
  EXPECT_NE(e0, e1);
  EXPECT_EQ(a.indices(), e1);  // asking twice does not advance anything
  b.set_epoch(1);
  EXPECT_EQ(b.indices(), e1);
  a.set_epoch(0);
  EXPECT_EQ(a.indices(), e0);
  // seed + epoch: epoch 1 of seed 123 is epoch 0 of seed 124
  EXPECT_EQ(e1, c.indices());
  EXPECT_EQ(a.epoch(), 0);
}

TEST(Sampler, RandomIsFisherYatesOverGenerator) {
  const int64_t n = 50;
  RandomSampler s(n, 9);
  s.set_epoch(2);
  std::vector<int64_t> ref(n);
  std::iota(ref.begin(), ref.end(), 0);
  Generator g(11);
  for (int64_t i = n - 1; i > 0; --i) std::swap(ref[i], ref[g.below(i + 1)]);
  EXPECT_EQ(s.indices(), ref);
  EXPECT_EQ(data::random_permutation(n, 11), ref);
}

TEST(Sampler, RandomDoesNotTouchDefaultGenerator) {
  manual_seed(5);
  const uint64_t expect = Generator(5).next_u64();
  RandomSampler(100, 1).indices();
  EXPECT_EQ(default_generator().next_u64(), expect);
}
