// DataLoader: every sample exactly once per epoch in sampler order (with 1 and
// several workers, and synchronously), batches kept by the consumer stay
// intact, drop_last, worker exceptions rethrown on the consumer at the failing
// batch, destruction and restart mid-epoch without hangs, argument errors.
#include "data/data_loader.h"

#include <gtest/gtest.h>

#include "common/test_util.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"

using namespace tandem;
using data::Batch;
using data::DataLoader;

using tandem::test::TempDir;
using tandem::test::error_of;
using tandem::test::read_file;

namespace {

// Sample i: image [1] = i (float), label i. Optionally throws at one index and
// sleeps a little to shuffle thread timing (no timing is asserted).
class FakeDataset : public data::Dataset {
 public:
  explicit FakeDataset(int64_t n, int64_t throw_at = -1, bool jitter = false)
      : n_(n), throw_at_(throw_at), jitter_(jitter) {}
  int64_t size() const override { return n_; }
  void get_batch_into(const std::vector<int64_t>& indices, Batch& out) const override {
    calls.fetch_add(1);
    const int64_t b = static_cast<int64_t>(indices.size());
    if (!data::reusable_buffer(out.images, {b, 1}, kFloat32)) out.images = Tensor::empty({b, 1}, kFloat32);
    if (!data::reusable_buffer(out.labels, {b}, kInt64)) out.labels = Tensor::empty({b}, kInt64);
    out.indices = indices;
    for (int64_t k = 0; k < b; ++k) {
      const int64_t i = indices[k];
      TANDEM_CHECK(i != throw_at_, "FakeDataset: sample ", i, " is poisoned");
      TANDEM_CHECK(i >= 0 && i < n_, "FakeDataset: index ", i, " out of range");
      out.images.data<float>()[k] = static_cast<float>(i);
      out.labels.data<int64_t>()[k] = i;
    }
    if (jitter_)
      std::this_thread::sleep_for(std::chrono::microseconds((indices.empty() ? 0 : indices[0]) % 7 * 50));
  }
  mutable std::atomic<int> calls{0};

 private:
  int64_t n_, throw_at_;
  bool jitter_;
};


std::vector<Batch> drain(DataLoader& loader) {
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(*b);
  return out;
}

}  // namespace

TEST(DataLoader, CoversEverySampleOnceInSamplerOrder) {
  for (int workers : {0, 1, 3}) {
    for (int prefetch : {1, 2, 4}) {
      auto ds = std::make_shared<FakeDataset>(103, -1, true);
      auto sampler = std::make_shared<data::RandomSampler>(103, 7);
      DataLoader loader(ds, sampler, 10, false, prefetch, workers);
      EXPECT_EQ(loader.num_batches(), 11);
      std::vector<int64_t> previous;
      for (int64_t epoch : {0, 1}) {
        loader.begin_epoch(epoch);
        const std::vector<int64_t> order = sampler->indices();
        // Keep every batch: the loader must not overwrite batches the consumer still holds.
        const std::vector<Batch> batches = drain(loader);
        ASSERT_EQ(batches.size(), 11u) << workers << " workers";
        std::vector<int64_t> seen_labels, seen_images, seen_indices;
        for (size_t k = 0; k < batches.size(); ++k) {
          EXPECT_EQ(batches[k].labels.numel(), k + 1 < batches.size() ? 10 : 3);
          for (int64_t v : batches[k].labels.to_vector<int64_t>()) seen_labels.push_back(v);
          for (float v : batches[k].images.to_vector<float>()) seen_images.push_back(static_cast<int64_t>(v));
          seen_indices.insert(seen_indices.end(), batches[k].indices.begin(), batches[k].indices.end());
        }
        EXPECT_EQ(seen_labels, order) << workers << " workers, prefetch " << prefetch;
        EXPECT_EQ(seen_images, order);
        EXPECT_EQ(seen_indices, order);
        EXPECT_NE(order, previous);  // a new shuffle each epoch
        previous = order;
        EXPECT_FALSE(loader.next().has_value());  // stays exhausted
      }
    }
  }
}

TEST(DataLoader, DropLast) {
  auto ds = std::make_shared<FakeDataset>(25);
  auto sampler = std::make_shared<data::SequentialSampler>(25);
  DataLoader keep(ds, sampler, 10, false);
  DataLoader drop(ds, sampler, 10, true);
  EXPECT_EQ(keep.num_batches(), 3);
  EXPECT_EQ(drop.num_batches(), 2);
  drop.begin_epoch(0);
  const std::vector<Batch> batches = drain(drop);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1].labels.to_vector<int64_t>(),
            (std::vector<int64_t>{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  DataLoader exact(ds, std::make_shared<data::SequentialSampler>(20), 10, true);
  EXPECT_EQ(exact.num_batches(), 2);
  DataLoader tiny(ds, std::make_shared<data::SequentialSampler>(5), 10, true);
  EXPECT_EQ(tiny.num_batches(), 0);
  tiny.begin_epoch(0);
  EXPECT_FALSE(tiny.next().has_value());
}

TEST(DataLoader, WorkerExceptionRethrownAtItsBatch) {
  for (int workers : {0, 1, 4}) {
    auto ds = std::make_shared<FakeDataset>(100, 55);
    DataLoader loader(ds, std::make_shared<data::SequentialSampler>(100), 10, false, 3, workers);
    loader.begin_epoch(0);
    for (int k = 0; k < 5; ++k) {
      auto b = loader.next();
      ASSERT_TRUE(b.has_value());
      EXPECT_EQ(b->labels.to_vector<int64_t>()[0], k * 10);
    }
    EXPECT_HAS(error_of([&] { loader.next(); }), "sample 55 is poisoned");
    EXPECT_HAS(error_of([&] { loader.next(); }), "sample 55 is poisoned");  // sticky for the epoch
    loader.begin_epoch(1);                                                  // a new epoch starts cleanly
    auto first = loader.next();
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->labels.to_vector<int64_t>()[0], 0);
  }
}

TEST(DataLoader, DestroyAndRestartMidEpoch) {
  auto ds = std::make_shared<FakeDataset>(1000, -1, true);
  auto sampler = std::make_shared<data::SequentialSampler>(1000);
  {
    DataLoader loader(ds, sampler, 4, false, 2, 3);
    loader.begin_epoch(0);  // destroyed without taking anything: workers block on a full window
  }
  {
    DataLoader loader(ds, sampler, 4, false, 2, 3);
    loader.begin_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    ASSERT_TRUE(loader.next().has_value());
  }
  {
    DataLoader loader(ds, sampler, 4, false, 2, 2);
    loader.begin_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    loader.begin_epoch(1);  // abandon epoch 0 mid-way
    const std::vector<Batch> batches = drain(loader);
    ASSERT_EQ(batches.size(), 250u);
    EXPECT_EQ(batches[0].labels.to_vector<int64_t>()[0], 0);
    EXPECT_EQ(batches[249].labels.to_vector<int64_t>()[3], 999);
  }
  { DataLoader never_started(ds, sampler, 4); }
  // Bounded prefetch: with nothing consumed, at most `prefetch` batches get built.
  auto counted = std::make_shared<FakeDataset>(1000);
  {
    DataLoader loader(counted, sampler, 4, false, 2, 3);
    loader.begin_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
  }
  EXPECT_LE(counted->calls.load(), 1 + 2);
}

TEST(DataLoader, ArgumentErrors) {
  auto ds = std::make_shared<FakeDataset>(10);
  auto sampler = std::make_shared<data::SequentialSampler>(10);
  EXPECT_HAS(error_of([&] { DataLoader(ds, sampler, 0); }), "batch_size");
  EXPECT_HAS(error_of([&] { DataLoader(ds, sampler, 4, false, 0, 1); }), "prefetch");
  EXPECT_HAS(error_of([&] { DataLoader(ds, sampler, 4, false, 2, -1); }), "workers");
  EXPECT_HAS(error_of([&] { DataLoader(nullptr, sampler, 4); }), "dataset");
  DataLoader loader(ds, sampler, 4);
  EXPECT_HAS(error_of([&] { loader.next(); }), "begin_epoch");
  // indices beyond the dataset surface as the dataset's error
  DataLoader too_many(ds, std::make_shared<data::SequentialSampler>(12), 4);
  too_many.begin_epoch(0);
  too_many.next();
  too_many.next();
  EXPECT_HAS(error_of([&] { too_many.next(); }), "index 10 out of range");
}
