// Reading a FullyShardedDataParallel sharded checkpoint (FullyShardedDataParallel::save_sharded's
// directory: fsdp.json and shard-<rank>-of-<world>.safetensors) without a process group.
#pragma once

#include <string>

#include "core/safetensors.h"

namespace tandem::dist {

// Checks that every file of the sharded checkpoint in `dir` is there and whole: fsdp.json parses as a
// sharded index and each rank's shard file passes its CRC-32C checks. Throws SafetensorsError for a
// damaged shard file, Error naming the file for anything else.
void verify_sharded_checkpoint(const std::string& dir);

// The module's full state dict (its own parameter names and shapes, as save_full writes it) assembled
// in one process from the shard files: each unit's shards laid end to end and cut into its parameters.
// The buffers are rank 0's.
TensorMap load_sharded_state_dict(const std::string& dir);

}  // namespace tandem::dist
