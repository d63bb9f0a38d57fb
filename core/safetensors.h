// safetensors files (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// padded with spaces to a multiple of 8, then the raw little-endian data, each
// tensor's bytes at [begin, end) from the start of the data, with no holes.
// Supported dtypes: F32 F64 F16 BF16 I64 I32 U8.
//
// save_safetensors accepts tensors of any layout on any device (copied to host
// contiguous), writes data largest element size first (so every tensor is
// aligned to its element size) and is atomic: it writes PATH.tmp.<pid>, fsyncs
// and renames it over PATH, so a failed save leaves the previous file intact.
// load_safetensors validates the whole file before trusting it and throws
// tandem::Error naming the file (and tensor) on any inconsistency.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"

namespace tandem {

using TensorMap = std::map<std::string, Tensor>;

// Host tensors, contiguous, one storage each.
TensorMap load_safetensors(const std::string& path);
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem
