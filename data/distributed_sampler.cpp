// DistributedSampler (see distributed_sampler.h). Mirrors PyTorch's
// DistributedSampler.__iter__ step by step: common order, pad or truncate to
// total_size, then the strided slice order[rank : total_size : num_replicas].
#include "data/distributed_sampler.h"

#include <algorithm>
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
  num_samples_ = samples_for(n);
}

int64_t DistributedSampler::samples_for(int64_t n) const {
  // PyTorch: with drop_last and an uneven split, ceil((n - R) / R) == floor(n / R);
  // otherwise ceil(n / R).
  if (!pad_) return rank_ < n ? (n - rank_ + num_replicas_ - 1) / num_replicas_ : 0;
  return drop_last_ ? n / num_replicas_ : (n + num_replicas_ - 1) / num_replicas_;
}

void DistributedSampler::resume_epoch_after(int64_t epoch, int64_t consumed) {
  TANDEM_CHECK(consumed >= 0, "DistributedSampler::resume_epoch_after: consumed must be >= 0, got ", consumed);
  resume_epoch_ = epoch;
  resume_consumed_ = std::min(consumed, n_);
  resume_samples_ = samples_for(n_ - resume_consumed_);
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = random_permutation(n_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t(0));
  }
  int64_t n = n_, samples = num_samples_;
  if (epoch_ == resume_epoch_) {  // the rest of a begun epoch: positions consumed..n-1
    order.erase(order.begin(), order.begin() + resume_consumed_);
    n = n_ - resume_consumed_;
    samples = resume_samples_;
  }
  const int64_t total = pad_ ? samples * num_replicas_ : n;
  if (total > n) {
    // Pad by repeating the order from its start (several times over when n < padding).
    order.reserve(static_cast<size_t>(total));
    for (int64_t i = n; i < total; ++i) order.push_back(order[static_cast<size_t>((i - n) % n)]);
  } else {
    order.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(samples));
  for (int64_t i = rank_; i < total; i += num_replicas_) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace tandem::data
