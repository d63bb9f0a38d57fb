// DistributedSampler: PyTorch's exact shares (checked against values worked out
// from torch.utils.data.DistributedSampler's code), disjoint cover of the
// dataset, padding and truncation, one common permutation per (seed, epoch).
#include "data/distributed_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "core/error.h"

using namespace tandem;
using data::DistributedSampler;

namespace {

std::vector<std::vector<int64_t>> shares(int64_t n, int64_t R, bool shuffle, uint64_t seed, bool drop_last,
                                         int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < R; ++r) {
    DistributedSampler s(n, R, r, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

// Undoes the strided split: common[r + i * R] = share_r[i].
std::vector<int64_t> interleave(const std::vector<std::vector<int64_t>>& parts) {
  std::vector<int64_t> out;
  for (size_t i = 0; !parts.empty() && i < parts[0].size(); ++i)
    for (const auto& p : parts) out.push_back(p[i]);
  return out;
}

}  // namespace

TEST(DistributedSampler, PyTorchValuesWithoutShuffle) {
  // 10 samples, 3 ranks: ceil(10/3) = 4 each, total 12, order padded with 0, 1.
  auto s = shares(10, 3, false, 0, false, 0);
  EXPECT_EQ(s[0], (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(s[1], (std::vector<int64_t>{1, 4, 7, 0}));
  EXPECT_EQ(s[2], (std::vector<int64_t>{2, 5, 8, 1}));
  // drop_last: floor(10/3) = 3 each, total 9, index 9 dropped.
  s = shares(10, 3, false, 0, true, 0);
  EXPECT_EQ(s[0], (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(s[1], (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(s[2], (std::vector<int64_t>{2, 5, 8}));
  // Fewer samples than ranks: the order repeats several times (0 1 0 1 0).
  s = shares(2, 5, false, 0, false, 0);
  for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(s[r], (std::vector<int64_t>{r % 2})) << "rank " << r;
  // ... and with drop_last nobody gets anything.
  for (const auto& part : shares(2, 5, false, 0, true, 0)) EXPECT_TRUE(part.empty());
}

TEST(DistributedSampler, SizesFollowPyTorch) {
  DistributedSampler a(10, 3, 0);
  EXPECT_EQ(a.num_samples(), 4);
  EXPECT_EQ(a.size(), 4);
  EXPECT_EQ(a.total_size(), 12);
  DistributedSampler b(10, 3, 2, true, 0, true);
  EXPECT_EQ(b.num_samples(), 3);
  EXPECT_EQ(b.total_size(), 9);
  DistributedSampler c(12, 4, 1, true, 0, true);
  EXPECT_EQ(c.num_samples(), 3);
  DistributedSampler d(0, 4, 3);
  EXPECT_EQ(d.num_samples(), 0);
  EXPECT_TRUE(d.indices().empty());
}

TEST(DistributedSampler, DisjointCoverAndPadding) {
  for (int64_t n : {1, 2, 5, 10, 11, 64, 101}) {
    for (int64_t R : {1, 2, 3, 4, 7}) {
      for (bool shuffle : {false, true}) {
        const auto parts = shares(n, R, shuffle, 5, false, 2);
        const int64_t per = (n + R - 1) / R;
        std::map<int64_t, int> count;
        for (const auto& p : parts) {
          ASSERT_EQ(static_cast<int64_t>(p.size()), per) << "n=" << n << " R=" << R;
          for (int64_t i : p) {
            ASSERT_TRUE(i >= 0 && i < n) << i;
            ++count[i];
          }
        }
        // Every index appears; the per * R - n padded positions are repeats from the start.
        EXPECT_EQ(static_cast<int64_t>(count.size()), n) << "n=" << n << " R=" << R;
        const std::vector<int64_t> common = interleave(parts);
        for (int64_t k = n; k < per * R; ++k) EXPECT_EQ(common[k], common[(k - n) % n]);
        if (n % R == 0) {
          for (const auto& [i, c] : count) EXPECT_EQ(c, 1) << "index " << i << " with n=" << n << " R=" << R;
        }
      }
    }
  }
}

TEST(DistributedSampler, DropLastTruncates) {
  for (int64_t n : {1, 5, 10, 11, 101}) {
    for (int64_t R : {1, 2, 3, 4}) {
      const auto parts = shares(n, R, true, 9, true, 1);
      std::map<int64_t, int> count;
      for (const auto& p : parts) {
        ASSERT_EQ(static_cast<int64_t>(p.size()), n / R);
        for (int64_t i : p) ++count[i];
      }
      EXPECT_EQ(static_cast<int64_t>(count.size()), (n / R) * R) << "n=" << n << " R=" << R;
      for (const auto& [i, c] : count) EXPECT_EQ(c, 1);
      // The kept positions are the first total_size of the epoch's permutation.
      std::vector<int64_t> expect = data::random_permutation(n, 10);
      expect.resize(static_cast<size_t>((n / R) * R));
      EXPECT_EQ(interleave(parts), expect);
    }
  }
}

TEST(DistributedSampler, SamePermutationOnEveryRank) {
  const int64_t n = 50, R = 4;
  const uint64_t seed = 7;
  const int64_t epoch = 3;
  std::vector<int64_t> expect = data::random_permutation(n, seed + epoch);
  expect.push_back(expect[0]);  // padded to 52
  expect.push_back(expect[1]);
  EXPECT_EQ(interleave(shares(n, R, true, seed, false, epoch)), expect);
}

TEST(DistributedSampler, SeedAndEpochDeterminism) {
  DistributedSampler a(100, 3, 1, true, 42), b(100, 3, 1, true, 42);
  EXPECT_EQ(a.indices(), b.indices());
  const std::vector<int64_t> epoch0 = a.indices();
  a.set_epoch(1);
  EXPECT_EQ(a.epoch(), 1);
  const std::vector<int64_t> epoch1 = a.indices();
  EXPECT_NE(epoch0, epoch1);
  b.set_epoch(1);
  EXPECT_EQ(b.indices(), epoch1);
  a.set_epoch(0);
  EXPECT_EQ(a.indices(), epoch0);
  // seed + epoch is what matters: (seed 41, epoch 1) == (seed 42, epoch 0), as in PyTorch.
  DistributedSampler c(100, 3, 1, true, 41);
  c.set_epoch(1);
  EXPECT_EQ(c.indices(), epoch0);
  DistributedSampler d(100, 3, 1, true, 43);
  EXPECT_NE(d.indices(), epoch0);
  // Without shuffle the epoch changes nothing.
  DistributedSampler e(10, 3, 0, false);
  const std::vector<int64_t> first = e.indices();
  e.set_epoch(5);
  EXPECT_EQ(e.indices(), first);
}

TEST(DistributedSampler, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(10, 0, 0), Error);
  EXPECT_THROW(DistributedSampler(10, 2, 2), Error);
  EXPECT_THROW(DistributedSampler(10, 2, -1), Error);
  EXPECT_THROW(DistributedSampler(-1, 2, 0), Error);
  try {
    DistributedSampler(10, 4, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 3]"), std::string::npos) << e.what();
  }
}

// pad false (MMEngine's round_up=False): nothing repeated, every index exactly once over the ranks,
// the first n mod R ranks one index more, each rank's share the same positions as when padded.
TEST(DistributedSampler, WithoutPaddingEveryIndexOnceAndSharesDifferByAtMostOne) {
  for (int64_t n : {0, 1, 5, 10, 11, 101}) {
    for (int64_t R : {1, 2, 3, 4}) {
      std::map<int64_t, int> count;
      for (int64_t r = 0; r < R; ++r) {
        data::DistributedSampler s(n, R, r, /*shuffle=*/true, 9, /*drop_last=*/false, /*pad=*/false);
        s.set_epoch(1);
        const auto mine = s.indices();
        ASSERT_EQ(static_cast<int64_t>(mine.size()), s.size()) << "n=" << n << " R=" << R << " r=" << r;
        EXPECT_EQ(s.size(), n / R + (r < n % R ? 1 : 0)) << "n=" << n << " R=" << R << " r=" << r;
        data::DistributedSampler padded(n, R, r, true, 9);
        padded.set_epoch(1);
        const auto all = padded.indices();
        for (size_t k = 0; k < mine.size(); ++k) EXPECT_EQ(mine[k], all[k]);
        for (int64_t i : mine) ++count[i];
      }
      EXPECT_EQ(static_cast<int64_t>(count.size()), n) << "n=" << n << " R=" << R;
      for (const auto& [i, c] : count) EXPECT_EQ(c, 1) << "index " << i;
    }
  }
}

// resume_epoch_after: old world A consumed k batches of B per rank (positions 0 .. k*B*A of the common
// order); the new world's ranks together visit exactly the remaining positions, each once (plus the
// padding repeats), and the next epoch is the ordinary one.
TEST(DistributedSampler, ResumedEpochCoversExactlyTheRestOfItsOrder) {
  for (const auto& [n, old_world, new_world, batches] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{{640, 2, 1, 3}, {100, 4, 3, 2}, {97, 1, 2, 5},
                                                                   {50, 3, 2, 0}}) {
    const int64_t batch = 8, consumed = batches * batch * old_world, epoch = 2;
    std::vector<int64_t> common = shares(n, 1, true, 7, false, epoch)[0];  // the epoch's common order
    std::vector<int64_t> seen;
    for (int64_t r = 0; r < new_world; ++r) {
      DistributedSampler s(n, new_world, r, true, 7);
      s.resume_epoch_after(epoch, consumed);
      s.set_epoch(epoch);
      const std::vector<int64_t> mine = s.indices();
      EXPECT_EQ(static_cast<int64_t>(mine.size()), s.size());
      EXPECT_EQ(s.size(), (n - consumed + new_world - 1) / new_world);
      seen.insert(seen.end(), mine.begin(), mine.end());
      s.set_epoch(epoch + 1);  // later epochs are untouched
      EXPECT_EQ(s.indices(), shares(n, new_world, true, 7, false, epoch + 1)[static_cast<size_t>(r)]);
    }
    std::vector<int64_t> rest(common.begin() + consumed, common.end());
    std::sort(rest.begin(), rest.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());  // padding repeats some
    EXPECT_EQ(seen, rest) << "n " << n << " " << old_world << " -> " << new_world;
  }
}
