// One unit of FullyShardedDataParallel (internal to dist/parallel: fsdp.cpp and fsdp_checkpoint.cpp):
// its parameters, their place in the flat buffer, the buffer whose memory comes and goes, this
// rank's shard, and the gather and the reduction in flight.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/storage.h"
#include "core/tensor.h"
#include "dist/group/process_group.h"
#include "dist/parallel/fsdp.h"

namespace tandem::dist {

struct FullyShardedDataParallel::Unit {
  std::string path;
  std::vector<std::pair<std::string, Tensor>> params;  // the module's own tensors (views of `full`)
  std::vector<int64_t> offsets;
  int64_t numel = 0, shard_numel = 0, total = 0;  // total: the flat buffer's elements
  DType dtype = kFloat32;
  Device device = Device::cpu();
  std::shared_ptr<Storage> full;     // the gathered flat parameter; memory only while gathered
  Tensor shard;                      // this rank's part (NO_SHARD: a tensor over `full`)
  std::shared_ptr<Storage> staging;  // a gather in flight writes here
  std::shared_ptr<Work> gathering;
  std::vector<uint64_t> hooks;  // post-accumulate hook handles, per parameter (0: none)
  bool accessed = false;        // read in the current forward
  int grad_params = 0, grads_ready = 0;
  bool reduced = false;
  std::shared_ptr<Work> reducing;
  Tensor reduce_in, reduce_out;

  bool root() const { return path.empty(); }
  int64_t bytes() const { return total * static_cast<int64_t>(element_size(dtype)); }
  std::string describe() const {
    std::string names;
    for (size_t i = 0; i < params.size() && i < 3; ++i) names += (i ? ", " : "") + params[i].first;
    if (params.size() > 3) names += ", ...";
    return "unit '" + (root() ? std::string("<root>") : path) + "' (" + names + ")";
  }
};

}  // namespace tandem::dist
