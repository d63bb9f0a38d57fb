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

// dst (contiguous; float32, bfloat16 or float16) = src * factor, in float32 math with one rounding
// to dst's dtype: the casts of mixed precision fused into the copies the unit makes anyway. Host to
// device (cpu_offload) and CUDA go through a float32 copy.
void fsdp_cast_scaled(Tensor& dst, const Tensor& src, double factor = 1.0);

struct FullyShardedDataParallel::Unit {
  std::string path;
  std::vector<std::pair<std::string, Tensor>> params;  // the module's own tensors (views of `full`)
  std::vector<int64_t> offsets;
  int64_t numel = 0, shard_numel = 0, total = 0;  // total: the flat buffer's elements
  DType dtype = kFloat32;            // the parameters' own: the shard's (the master copy)
  DType param_dtype = kFloat32;      // the gathered buffer's and so the module's parameters' (mixed precision)
  DType reduce_dtype = kFloat32;     // the gradients' in the reduction
  bool full_precision = false;       // a module_classes_to_ignore unit
  Device device = Device::cpu();     // the module's
  std::shared_ptr<Storage> full;     // the gathered flat parameter; memory only while gathered
  std::shared_ptr<Storage> summoned; // gather_full_params() of a mixed unit: the float32 values
  Tensor shard;                      // this rank's part (NO_SHARD without casts: a tensor over `full`),
                                     // in host memory under cpu_offload
  std::shared_ptr<Storage> staging;  // a gather in flight writes here
  std::shared_ptr<Work> gathering;
  std::vector<uint64_t> hooks;  // post-accumulate hook handles, per parameter (0: none)
  bool accessed = false;        // read in the current forward
  int grad_params = 0, grads_ready = 0;
  bool reduced = false;
  std::shared_ptr<Work> reducing;
  Tensor reduce_in, reduce_out;

  bool root() const { return path.empty(); }
  bool mixed() const { return param_dtype != dtype; }
  // The gathered buffer's bytes.
  int64_t bytes() const { return total * static_cast<int64_t>(element_size(param_dtype)); }
  std::string describe() const {
    std::string names;
    for (size_t i = 0; i < params.size() && i < 3; ++i) names += (i ? ", " : "") + params[i].first;
    if (params.size() > 3) names += ", ...";
    return "unit '" + (root() ? std::string("<root>") : path) + "' (" + names + ")";
  }
};

}  // namespace tandem::dist
