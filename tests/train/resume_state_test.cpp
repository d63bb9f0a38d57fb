// The state pieces an exact resume restores, each checked by its defining
// property: continuing from saved state gives the same sequence as never
// stopping (Generator, DataLoader position, LR schedules, StopSignal).
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>

#include "common/test_util.h"
#include "core/random.h"
#include "data/data_loader.h"
#include "data/distributed_sampler.h"
#include "data/sampler.h"
#include "optim/optimizer.h"
#include "train/stop_signal.h"

namespace tandem {
namespace {

using test::error_of;

TEST(GeneratorState, SetStateContinuesTheSameSequence) {
  Generator a(42);
  for (int i = 0; i < 100; ++i) a.next_u64();
  const std::string saved = a.state();
  std::vector<uint64_t> expected;
  for (int i = 0; i < 10; ++i) expected.push_back(a.next_u64());
  Generator b(7);
  b.set_state(saved);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b.next_u64(), expected[i]) << i;
  EXPECT_HAS(error_of([&] { b.set_state("not a state"); }), "not a mt19937_64 state");
}

// A dataset whose sample i is the value i, so a batch shows which indices it holds.
class Indices : public data::Dataset {
 public:
  explicit Indices(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  void get_batch_into(const std::vector<int64_t>& idx, data::Batch& out) const override {
    std::vector<float> v(idx.begin(), idx.end());
    out.images = Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size())});
    out.labels = Tensor::from_vector<int64_t>(idx, {static_cast<int64_t>(idx.size())});
  }

 private:
  int64_t n_;
};

std::vector<std::vector<int64_t>> epoch_batches(data::DataLoader& loader, int64_t epoch, int64_t skip) {
  std::vector<std::vector<int64_t>> out;
  loader.begin_epoch(epoch, skip);
  EXPECT_EQ(loader.position(), skip);
  while (auto b = loader.next()) out.push_back(b->labels.to_vector<int64_t>());
  return out;
}

TEST(DataLoaderResume, SkippingBatchesGivesTheRestOfTheSameEpoch) {
  auto ds = std::make_shared<Indices>(100);
  for (int workers : {0, 1, 2}) {
    auto sampler = std::make_shared<data::RandomSampler>(100, 5);
    data::DataLoader loader(ds, sampler, 8, false, 2, workers);
    const auto full = epoch_batches(loader, 3, 0);
    ASSERT_EQ(full.size(), 13u);
    for (int64_t skip : {1, 5, 12, 13}) {
      const auto rest = epoch_batches(loader, 3, skip);
      ASSERT_EQ(rest.size(), full.size() - skip) << "workers " << workers << " skip " << skip;
      for (size_t k = 0; k < rest.size(); ++k) EXPECT_EQ(rest[k], full[skip + k]) << k;
      EXPECT_EQ(loader.position(), 13);
    }
    EXPECT_HAS(error_of([&] { loader.begin_epoch(0, 14); }), "cannot skip 14 batches of an epoch of 13");
  }
}

TEST(DataLoaderResume, DistributedSamplerShardsResumeToo) {
  auto ds = std::make_shared<Indices>(50);
  for (int rank : {0, 1}) {
    auto sampler = std::make_shared<data::DistributedSampler>(50, 2, rank, true, 9);
    data::DataLoader loader(ds, sampler, 4);
    const auto full = epoch_batches(loader, 1, 0);
    const auto rest = epoch_batches(loader, 1, 3);
    ASSERT_EQ(rest.size() + 3, full.size());
    for (size_t k = 0; k < rest.size(); ++k) EXPECT_EQ(rest[k], full[k + 3]);
  }
}

std::vector<Tensor> one_param() {
  Tensor p = Tensor::zeros({2});
  p.set_requires_grad(true);
  return {p};
}

TEST(SchedulerState, CosineResumesToTheSameLrs) {
  auto params = one_param();
  optim::SGD a(params, {0.1}), b(one_param(), {0.1});
  optim::CosineAnnealingLR sa(a, 20, 0.001), sb(b, 20, 0.001);
  for (int i = 0; i < 7; ++i) sa.step();
  sb.load_state_dict(sa.state_dict());
  EXPECT_EQ(sb.last_step(), 7);
  EXPECT_EQ(b.lr(), a.lr());
  for (int i = 0; i < 5; ++i) {
    sa.step();
    sb.step();
    EXPECT_EQ(b.lr(), a.lr()) << i;
  }
  optim::CosineAnnealingLR other(b, 30);
  EXPECT_HAS(error_of([&] { other.load_state_dict(sa.state_dict()); }), "t_max = 20 but this schedule has 30");
}

TEST(SchedulerState, StepLrRestoresBaseLrsAndEpoch) {
  optim::SGD a(one_param(), {0.5}), b(one_param(), {0.9});
  optim::StepLR sa(a, 1, 0.7), sb(b, 1, 0.7);
  sa.step();
  sa.step();
  sb.load_state_dict(sa.state_dict());
  EXPECT_EQ(sb.last_epoch(), 2);
  EXPECT_EQ(b.lr(), a.lr());
  EXPECT_DOUBLE_EQ(b.lr(), 0.5 * 0.7 * 0.7);
  optim::StepLR other(b, 1, 0.5);
  EXPECT_HAS(error_of([&] { other.load_state_dict(sa.state_dict()); }), "gamma");
  auto st = sa.state_dict();
  st.erase("last_epoch");
  EXPECT_HAS(error_of([&] { sb.load_state_dict(st); }), "no 'last_epoch'");
}

TEST(StopSignal, RecordsTheFirstSignal) {
  train::StopSignal::reset();
  train::StopSignal::install();
  EXPECT_EQ(train::StopSignal::requested(), 0);
  ::raise(SIGTERM);  // handled: the test keeps running
  EXPECT_EQ(train::StopSignal::requested(), SIGTERM);
  train::StopSignal::request(SIGINT);
  EXPECT_EQ(train::StopSignal::requested(), SIGTERM) << "the first signal wins";
  EXPECT_EQ(train::StopSignal::exit_code(SIGTERM), 143);
  EXPECT_EQ(train::StopSignal::exit_code(SIGINT), 130);
  train::StopSignal::reset();
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
}

}  // namespace
}  // namespace tandem
