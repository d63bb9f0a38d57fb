// CharWindows: a CharCorpus (char_corpus.h) as a data::Dataset for the Runner. Sample i of the
// training part is the window of block_size + 1 tokens at i x block_size (consecutive, disjoint
// windows; the sampler shuffles their order each epoch); of the validation part, val_starts' window
// i. A batch is inputs int64 [B, T] ("images") and next-token targets int64 [B, T] ("labels").
#pragma once

#include <memory>
#include <vector>

#include "data/dataset.h"
#include "train/models/char_corpus.h"

namespace gpt {

class CharWindows : public tandem::data::Dataset {
 public:
  // train: the corpus's training part, else its validation part (at most max_val_windows windows).
  CharWindows(std::shared_ptr<const CharCorpus> corpus, int64_t block_size, bool train, int64_t max_val_windows = 64)
      : corpus_(std::move(corpus)), T_(block_size) {
    TANDEM_CHECK(T_ >= 1, "CharWindows: block_size must be >= 1, got ", T_);
    if (train) {
      for (int64_t s = 0; s + T_ + 1 <= corpus_->split; s += T_) starts_.push_back(s);
    } else {
      starts_ = corpus_->val_starts(T_, max_val_windows);
    }
    TANDEM_CHECK(!starts_.empty(), "CharWindows: the corpus's ", train ? "training" : "validation",
                 " part holds no window of ", T_ + 1, " tokens");
  }
  int64_t size() const override { return static_cast<int64_t>(starts_.size()); }
  void get_batch_into(const std::vector<int64_t>& indices, tandem::data::Batch& out) const override {
    std::vector<int64_t> starts;
    starts.reserve(indices.size());
    for (int64_t i : indices) starts.push_back(starts_[static_cast<size_t>(i)]);
    CharCorpus::Batch b = corpus_->window_batch(starts, T_);
    out.images = b.x;
    out.labels = b.y;
    out.indices = indices;
  }
  const CharCorpus& corpus() const { return *corpus_; }

 private:
  std::shared_ptr<const CharCorpus> corpus_;
  int64_t T_;
  std::vector<int64_t> starts_;
};

}  // namespace gpt
