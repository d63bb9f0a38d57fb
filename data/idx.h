// IDX files (the MNIST container): a 4-byte magic 00 00 <type> <ndim>, ndim
// big-endian uint32 dimensions, then the elements in row-major order. Reads raw
// or gzip-compressed files (detected by the gzip magic 1f 8b, not by the name).
// Only element type 0x08 (unsigned byte) is supported. Every structural problem
// (missing file, bad magic, unsupported type, truncated or over-long data)
// throws tandem::Error naming the file and what was found versus expected.
#pragma once

#include <string>

#include "core/tensor.h"

namespace tandem::data {

// Returns a contiguous uint8 host tensor with the stored shape.
Tensor read_idx(const std::string& path);

// Writes a uint8 tensor (any device, any layout, 1..255 dimensions) as a raw,
// uncompressed IDX file. Not atomic: for tests and tools.
void write_idx(const std::string& path, const Tensor& tensor);

}  // namespace tandem::data
