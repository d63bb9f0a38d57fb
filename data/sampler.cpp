// Sequential and random samplers (see sampler.h). The random order comes from
// a Generator owned by the call, never from the process-wide default, so it does
// not depend on what else drew random numbers.
#include "data/sampler.h"

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/random.h"

namespace tandem::data {

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed) {
  TANDEM_CHECK(n >= 0, "random_permutation: n must be >= 0, got ", n);
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t(0));
  Generator gen(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(gen.below(static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  TANDEM_CHECK(n >= 0, "SequentialSampler: dataset size must be >= 0, got ", n);
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> p(static_cast<size_t>(n_));
  std::iota(p.begin(), p.end(), int64_t(0));
  return p;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  TANDEM_CHECK(n >= 0, "RandomSampler: dataset size must be >= 0, got ", n);
}

std::vector<int64_t> RandomSampler::indices() const {
  return random_permutation(n_, seed_ + static_cast<uint64_t>(epoch_));
}

ShardSampler::ShardSampler(int64_t n, int64_t num_shards, int64_t rank) : n_(n), shards_(num_shards), rank_(rank) {
  TANDEM_CHECK(n >= 0 && num_shards >= 1 && rank >= 0 && rank < num_shards, "ShardSampler: bad arguments n=", n,
               " num_shards=", num_shards, " rank=", rank);
}

std::vector<int64_t> ShardSampler::indices() const {
  std::vector<int64_t> out;
  for (int64_t i = rank_; i < n_; i += shards_) out.push_back(i);
  return out;
}

int64_t ShardSampler::size() const { return n_ > rank_ ? (n_ - rank_ + shards_ - 1) / shards_ : 0; }

}  // namespace tandem::data
