// Dataset: the interface the DataLoader reads batches from, and Batch, what it
// hands out. A dataset is indexed 0..size()-1 and builds a whole batch at once
// from a list of sample indices (so it can vectorise the copy and
// normalisation). Assumes: get_batch_into is const and thread-safe (several
// loader workers call it at once) and never calls tandem::parallel_for (the
// kernels' thread pool belongs to the training thread). Guarantees of
// implementations: the batch content depends only on the indices.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::data {

struct Batch {
  Tensor images;                 // float32 [B, C, H, W] (or whatever the dataset yields)
  Tensor labels;                 // int64 [B]
  std::vector<int64_t> indices;  // the sample indices the batch was built from, in order
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Fills `out` with the samples at `indices`. May reuse out's tensors when they
  // already have the needed shape and dtype and nothing else holds them (see
  // reusable_buffer); otherwise allocates new ones.
  virtual void get_batch_into(const std::vector<int64_t>& indices, Batch& out) const = 0;

  Batch get_batch(const std::vector<int64_t>& indices) const {
    Batch b;
    get_batch_into(indices, b);
    return b;
  }
};

// True when `t` is a host tensor of this shape/dtype that no other handle or
// view refers to, so it can be overwritten in place without anyone noticing.
inline bool reusable_buffer(const Tensor& t, const Shape& shape, DType dtype) {
  return t.defined() && t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && t.dtype() == dtype &&
         t.shape() == shape && t.device().is_cpu() && t.offset() == 0 && t.is_contiguous();
}

}  // namespace tandem::data
