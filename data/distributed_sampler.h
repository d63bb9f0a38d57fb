// DistributedSampler: each of num_replicas ranks visits its own share of the
// dataset, exactly as PyTorch's torch.utils.data.DistributedSampler does. Every
// rank computes the same epoch order (random_permutation(n, seed + epoch) when
// shuffling, 0..n-1 otherwise), brings it to total_size = num_samples * R (by
// repeating indices from its start, or by truncating when drop_last), and rank r
// keeps order[r], order[r + R], ... . Assumes every rank is built with the same
// n, num_replicas, shuffle, seed and drop_last, and calls set_epoch(e) with the
// same e before each epoch. Guarantees: the shares of all ranks are disjoint
// positions of one common order, each has exactly num_samples() indices, and
// together they cover every index (without drop_last) or all but n mod R of them.
// pad false (MMEngine's DefaultSampler round_up=False): no repeated indices; rank r
// keeps order[r], order[r + R], ... below n, so the first n mod R ranks have one
// index more (uneven inputs: train them under dist::Join).
// resume_epoch_after(e, c): epoch e visits only positions c..n-1 of its common order (the rest of an
// epoch that other ranks, possibly another number of them, began), dealt out over this sampler's ranks
// as a whole order of that length would be; every other epoch is unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "data/sampler.h"

namespace tandem::data {

class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, int64_t num_replicas, int64_t rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false, bool pad = true);

  // This rank's indices for the current epoch, in visiting order.
  std::vector<int64_t> indices() const override;
  // Indices per rank and epoch: ceil(n / R), or floor(n / R) with drop_last; without
  // padding this rank's share of n. For the resumed epoch, the same of the n - consumed left.
  int64_t size() const override { return epoch_ == resume_epoch_ ? resume_samples_ : num_samples_; }

  // The next time epoch `epoch` is visited, it starts after the first `consumed` positions of its
  // common order (0 <= consumed; at most n are skipped).
  void resume_epoch_after(int64_t epoch, int64_t consumed);

  int64_t num_samples() const { return num_samples_; }
  // num_samples() * num_replicas(): the length of the padded/truncated common order.
  int64_t total_size() const { return pad_ ? num_samples_ * num_replicas_ : n_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  bool shuffle() const { return shuffle_; }
  bool drop_last() const { return drop_last_; }
  bool pad() const { return pad_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  int64_t num_replicas_;
  int64_t rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  bool pad_;
  int64_t num_samples_;
  int64_t resume_epoch_ = -1;  // the epoch resume_epoch_after() applies to, -1: none
  int64_t resume_consumed_ = 0;
  int64_t resume_samples_ = 0;
  // This rank's count among `n` positions dealt out over the ranks.
  int64_t samples_for(int64_t n) const;
};

}  // namespace tandem::data
