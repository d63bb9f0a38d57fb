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
// SafetensorsError naming the file (and tensor) on any inconsistency.
//
// Checksums (Tandem's addition, invisible to other readers): save_safetensors
// stores __metadata__["tandem.crc32c"], a string holding a JSON object
//   {"__header__": "1a2b3c4d", "<tensor name>": "<CRC-32C of its data bytes>", ...}
// of eight lower-case hex digits each (core/checksum.h's crc32c). "__header__"
// is the CRC-32C of the header as nlohmann::json dumps it compactly (keys
// sorted, no spaces, no padding) with "__header__" itself left out of the
// table, so it covers every dtype, shape, offset, metadata value and the
// tensors' checksums. Loading verifies the header's CRC before trusting the
// header, and each tensor's CRC as its bytes are read; the metadata it returns
// leaves the table out (load_safetensors_file: tensors and metadata in one pass, with the same
// checks). A file without the table (written by another tool, or
// by Tandem before checksums) loads unverified, with a one-line warning once
// per path and process; a file whose metadata holds the table under another
// key (a damaged key) is refused, so that damage cannot pass as "no checksums".
#pragma once

#include <map>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace tandem {

using TensorMap = std::map<std::string, Tensor>;

// What load_safetensors and load_safetensors_metadata throw when a file's content is wrong (not
// safetensors, inconsistent, shorter than its header says, or failing a checksum). what() is
// "safetensors file '<path>'[, tensor '<name>']: <problem>"; the parts are kept for callers that
// say what to do (a checkpoint: resume from an earlier one). One line: no part holds a newline.
class SafetensorsError : public Error {
 public:
  SafetensorsError(std::string path, std::string tensor, std::string problem);
  const std::string& path() const { return path_; }
  // The tensor at fault ("" when none is), as messages show it: bytes other than printable ASCII as
  // \xNN, at most 64 characters.
  const std::string& tensor() const { return tensor_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string path_, tensor_, problem_;
};

// The metadata key of the checksum table (see above).
inline constexpr const char* kChecksumMetadataKey = "tandem.crc32c";

// Host tensors, contiguous, one storage each.
TensorMap load_safetensors(const std::string& path);
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);
// Both in one pass over the file (one open, one header parse, the same checks).
struct SafetensorsFile {
  TensorMap tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsFile load_safetensors_file(const std::string& path);

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem
