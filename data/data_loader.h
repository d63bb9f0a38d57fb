// DataLoader: cuts the sampler's epoch order into batches and has background
// worker threads build them (Dataset::get_batch_into) into a bounded window of
// `prefetch` batches ahead of the consumer, while the training step runs.
//
// Use (one consumer thread):
//   loader.begin_epoch(epoch);                 // sampler.set_epoch(epoch), starts the workers
//   while (auto batch = loader.next()) { ... } // batches in sampler order, then std::nullopt
//
// Guarantees: batch k holds exactly the sampler's indices [k*B, (k+1)*B) (the
// last one shorter unless drop_last), whatever the thread timing; an exception
// thrown while building batch k is rethrown by the next() that would have
// returned batch k (and by every later next() of that epoch); begin_epoch()
// mid-epoch and the destructor stop and join the workers without waiting for
// the rest of the epoch. workers == 0 builds each batch inside next() on the
// calling thread. Buffers: the loader keeps prefetch + 2 batch slots and
// refills a slot's tensors in place when the consumer no longer holds them.
// Workers never call tandem::parallel_for (Dataset's contract).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/sampler.h"

namespace tandem::data {

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<Sampler> sampler, int64_t batch_size,
             bool drop_last = false, int prefetch = 2, int workers = 1);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts epoch `epoch` (abandoning any unfinished one). skip_batches > 0
  // resumes an epoch part-way: the first batch returned is batch skip_batches
  // of the epoch's order (the same one an uninterrupted epoch would return then).
  void begin_epoch(int64_t epoch, int64_t skip_batches = 0);
  // The next batch of the current epoch, or std::nullopt once it is exhausted.
  std::optional<Batch> next();

  // Batches per epoch for the sampler's current size.
  int64_t num_batches() const;
  int64_t batch_size() const { return batch_size_; }
  bool drop_last() const { return drop_last_; }
  int64_t epoch() const { return epoch_; }
  // Batches of the current epoch returned so far (skipped ones included):
  // with epoch(), the position a resumed run passes to begin_epoch.
  int64_t position() const { return next_take_; }
  const Dataset& dataset() const { return *dataset_; }
  Sampler& sampler() { return *sampler_; }

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
    int64_t index = -1;  // which batch of the epoch the slot holds
    bool ready = false;
  };

  void stop_workers();
  void worker_loop();
  std::vector<int64_t> batch_indices(int64_t k) const;
  void build(int64_t k, Batch& out) const;

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<Sampler> sampler_;
  int64_t batch_size_;
  bool drop_last_;
  int prefetch_;
  int workers_;

  // Epoch state. Written by the consumer only while no worker runs; read by workers.
  int64_t epoch_ = -1;
  bool active_ = false;
  std::vector<int64_t> order_;  // the sampler's indices for this epoch
  int64_t total_ = 0;           // batches this epoch
  std::exception_ptr error_;    // sticky failure of this epoch (consumer side)

  // Shared with the workers, guarded by mu_.
  std::mutex mu_;
  std::condition_variable work_cv_;   // workers wait for room in the window
  std::condition_variable ready_cv_;  // the consumer waits for its batch
  std::vector<Slot> slots_;
  int64_t next_claim_ = 0;  // next batch a worker may start
  int64_t next_take_ = 0;   // next batch the consumer returns
  bool stop_ = false;
  bool failed_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tandem::data
