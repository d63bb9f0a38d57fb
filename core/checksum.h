// CRC-32C (Castagnoli, the iSCSI polynomial), computed by Intel's ISA-L (hardware-accelerated).
// The checkpoint files' per-tensor and whole-file checksums and TensorBoard's record framing use it.
// crc32c("123456789") == 0xE3069283. Chaining: crc32c(b, crc32c(a)) == crc32c(a followed by b).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem {

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t previous = 0);

// TensorBoard's (and TFRecord's) masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t masked_crc32c(const void* data, std::size_t size);

// Eight lower-case hex digits, the form checksums take in file metadata.
std::string crc32c_hex(std::uint32_t crc);

}  // namespace tandem
