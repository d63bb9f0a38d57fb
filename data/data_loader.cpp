// DataLoader (see data_loader.h). Batch k lives in slot k % (prefetch + 2). A
// worker may claim batch k only while k < next_take + prefetch, so the slot it
// refills last held batch k - prefetch - 2, which the consumer returned at
// least two next() calls ago: the consumer's previous batch (and the one it is
// replacing) keep their buffers. Workers build outside the lock; ordering comes
// from the slot index, never from which thread finishes first.
#include "data/data_loader.h"

#include <algorithm>

namespace tandem::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<Sampler> sampler,
                       int64_t batch_size, bool drop_last, int prefetch, int workers)
    : dataset_(std::move(dataset)),
      sampler_(std::move(sampler)),
      batch_size_(batch_size),
      drop_last_(drop_last),
      prefetch_(prefetch),
      workers_(workers) {
  TANDEM_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
  TANDEM_CHECK(sampler_ != nullptr, "DataLoader: sampler is null");
  TANDEM_CHECK(batch_size_ > 0, "DataLoader: batch_size must be > 0, got ", batch_size_);
  TANDEM_CHECK(workers_ >= 0, "DataLoader: workers must be >= 0, got ", workers_);
  TANDEM_CHECK(prefetch_ >= 1 || workers_ == 0, "DataLoader: prefetch must be >= 1 with ", workers_,
               " worker thread(s), got ", prefetch_);
  slots_.resize(workers_ == 0 ? 1 : static_cast<size_t>(prefetch_) + 2);
}

DataLoader::~DataLoader() { stop_workers(); }

int64_t DataLoader::num_batches() const {
  const int64_t n = sampler_->size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void DataLoader::begin_epoch(int64_t epoch, int64_t skip_batches) {
  stop_workers();
  active_ = false;
  sampler_->set_epoch(epoch);
  order_ = sampler_->indices();
  TANDEM_CHECK(static_cast<int64_t>(order_.size()) == sampler_->size(), "DataLoader: the sampler returned ",
               order_.size(), " indices but its size() is ", sampler_->size());
  epoch_ = epoch;
  total_ = num_batches();
  TANDEM_CHECK(skip_batches >= 0 && skip_batches <= total_, "DataLoader::begin_epoch: cannot skip ", skip_batches,
               " batches of an epoch of ", total_);
  error_ = nullptr;
  next_claim_ = skip_batches;
  next_take_ = skip_batches;
  stop_ = false;
  failed_ = false;
  for (Slot& s : slots_) {
    s.error = nullptr;
    s.index = -1;
    s.ready = false;
  }
  active_ = true;
  if (workers_ > 0 && total_ > skip_batches) {
    const int n = static_cast<int>(std::min<int64_t>(workers_, total_ - skip_batches));
    threads_.reserve(n);
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { worker_loop(); });
  }
}

std::vector<int64_t> DataLoader::batch_indices(int64_t k) const {
  const int64_t begin = k * batch_size_;
  const int64_t end = std::min<int64_t>(begin + batch_size_, static_cast<int64_t>(order_.size()));
  return std::vector<int64_t>(order_.begin() + begin, order_.begin() + end);
}

void DataLoader::build(int64_t k, Batch& out) const { dataset_->get_batch_into(batch_indices(k), out); }

void DataLoader::worker_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] {
      return stop_ || failed_ || next_claim_ >= total_ || next_claim_ < next_take_ + prefetch_;
    });
    if (stop_ || failed_ || next_claim_ >= total_) return;
    const int64_t k = next_claim_++;
    Slot& slot = slots_[k % slots_.size()];
    slot.ready = false;
    Batch buf = std::move(slot.batch);
    lk.unlock();
    std::exception_ptr err;
    try {
      build(k, buf);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    slot.batch = std::move(buf);
    slot.error = err;
    slot.index = k;
    slot.ready = true;
    if (err) failed_ = true;
    ready_cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  TANDEM_CHECK(active_, "DataLoader::next() called before begin_epoch(epoch)");
  if (error_) std::rethrow_exception(error_);
  if (next_take_ >= total_) {
    stop_workers();
    return std::nullopt;
  }
  if (workers_ == 0) {
    Slot& slot = slots_[0];
    try {
      build(next_take_, slot.batch);
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
    ++next_take_;
    return slot.batch;
  }
  std::unique_lock<std::mutex> lk(mu_);
  Slot& slot = slots_[next_take_ % slots_.size()];
  const int64_t want = next_take_;
  ready_cv_.wait(lk, [&] { return slot.ready && slot.index == want; });
  if (slot.error) {
    error_ = slot.error;
    lk.unlock();
    stop_workers();
    std::rethrow_exception(error_);
  }
  Batch out = slot.batch;
  ++next_take_;
  lk.unlock();
  work_cv_.notify_all();
  return out;
}

}  // namespace tandem::data
