// Samplers: which sample indices an epoch visits, and in what order. The
// DataLoader asks for indices() once per epoch after set_epoch(epoch). The
// abstract Sampler is the extension point (a DistributedSampler that gives each
// rank its own share derives from it). Guarantees: indices() is a pure function
// of the constructor arguments and the last set_epoch(), so every process and
// every run that uses the same seed sees the same order.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices for the current epoch, in visiting order.
  virtual std::vector<int64_t> indices() const = 0;
  // How many indices indices() returns.
  virtual int64_t size() const = 0;
  // Selects the epoch (for samplers whose order depends on it).
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 protected:
  int64_t epoch_ = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1, drawn by Fisher-Yates from a Generator seeded with
// seed + epoch: different every epoch, identical for the same (seed, epoch).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// Rank `rank` of `num_shards` takes indices rank, rank + num_shards, ... < n:
// disjoint shards that together cover 0..n-1 exactly once (no padding), for
// evaluation sharded across ranks.
class ShardSampler : public Sampler {
 public:
  ShardSampler(int64_t n, int64_t num_shards, int64_t rank);
  std::vector<int64_t> indices() const override;
  int64_t size() const override;

 private:
  int64_t n_, shards_, rank_;
};

// The permutation RandomSampler uses: Fisher-Yates over 0..n-1 with
// Generator(seed).below(); exposed for samplers built on top of it.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed);

}  // namespace tandem::data
