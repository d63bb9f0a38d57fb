#include "core/checksum.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>
#include <cstdio>

namespace tandem {

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t previous) {
  // ISA-L keeps the register un-inverted between calls; the public value is inverted on both ends.
  unsigned int state = ~previous;
  auto* bytes = static_cast<unsigned char*>(const_cast<void*>(data));
  while (size > 0) {  // its length is an int
    const std::size_t chunk = std::min<std::size_t>(size, std::size_t{1} << 30);
    state = crc32_iscsi(bytes, static_cast<int>(chunk), state);
    bytes += chunk;
    size -= chunk;
  }
  return ~state;
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string crc32c_hex(std::uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", crc);
  return text;
}

}  // namespace tandem
