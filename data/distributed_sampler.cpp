// DistributedSampler (see distributed_sampler.h). Mirrors PyTorch's
// DistributedSampler.__iter__ step by step: common order, pad or truncate to
// total_size, then the strided slice order[rank : total_size : num_replicas].
#include "data/distributed_sampler.h"

#include <numeric>

#include "core/error.h"

namespace tandem::data {

DistributedSampler::DistributedSampler(int64_t n, int64_t num_replicas, int64_t rank, bool shuffle,
                                       uint64_t seed, bool drop_last, bool pad)
    : n_(n), num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last),
      pad_(pad || drop_last) {
  TANDEM_CHECK(n >= 0, "DistributedSampler: dataset size must be >= 0, got ", n);
  TANDEM_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, got ", num_replicas);
  TANDEM_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: invalid rank ", rank,
               ", rank should be in the interval [0, ", num_replicas - 1, "]");
  // PyTorch: with drop_last and an uneven split, ceil((n - R) / R) == floor(n / R);
  // otherwise ceil(n / R).
  num_samples_ = drop_last ? n / num_replicas : (n + num_replicas - 1) / num_replicas;
  if (!pad_) num_samples_ = rank < n ? (n - rank + num_replicas - 1) / num_replicas : 0;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = random_permutation(n_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t(0));
  }
  const int64_t total = pad_ ? total_size() : n_;
  if (total > n_) {
    // Pad by repeating the order from its start (several times over when n < padding).
    order.reserve(static_cast<size_t>(total));
    for (int64_t i = n_; i < total; ++i) order.push_back(order[static_cast<size_t>((i - n_) % n_)]);
  } else {
    order.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += num_replicas_) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace tandem::data
