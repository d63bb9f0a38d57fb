// Fuzz target: the TCPStore server's wire decoders, driven the way the server
// drives them on one connection's byte stream: a handshake (decode_hello),
// then u32-length-prefixed frames (decode_request) up to the server's frame
// limit. Contract checked: each decoder returns or throws tandem::Error, never
// reads past the bytes given (AddressSanitizer; each frame is copied to an
// exact-size heap buffer), and a decoded request re-encodes to the same bytes.
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include "core/error.h"
#include "dist/store/tcp_store.h"

namespace proto = tandem::dist::tcp_store_protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  try {
    size_t used = 0;
    std::optional<proto::Hello> hello = proto::decode_hello(data, size, &used);
    if (!hello) return 0;
    if (used > size) __builtin_trap();
    pos = used;
  } catch (const tandem::Error&) {
    return 0;
  }
  while (size - pos >= 4) {
    uint32_t len = 0;
    for (int i = 0; i < 4; ++i) len |= uint32_t{data[pos + i]} << (8 * i);
    pos += 4;
    if (len == 0 || len > size - pos) break;  // the server drops a zero length; a partial frame waits
    std::unique_ptr<uint8_t[]> frame(new uint8_t[len]);
    std::memcpy(frame.get(), data + pos, len);
    pos += len;
    try {
      proto::Request q = proto::decode_request(frame.get(), len);
      const tandem::dist::Bytes again = proto::encode_request(q);
      if (again.size() != len || std::memcmp(again.data(), frame.get(), len) != 0) __builtin_trap();
    } catch (const tandem::Error&) {
    }
  }
  return 0;
}
