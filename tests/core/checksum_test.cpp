#include "core/checksum.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

TEST(Crc32c, MatchesTheStandardCheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(crc32c(text.data(), text.size()), 0xE3069283u);  // RFC 3720's CRC-32C check value
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
}

TEST(Crc32c, ChainsAcrossPieces) {
  std::vector<unsigned char> bytes(100000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
  const std::uint32_t whole = crc32c(bytes.data(), bytes.size());
  const std::uint32_t first = crc32c(bytes.data(), 33333);
  EXPECT_EQ(crc32c(bytes.data() + 33333, bytes.size() - 33333, first), whole);
  bytes[50000] ^= 1;  // one flipped bit changes it
  EXPECT_NE(crc32c(bytes.data(), bytes.size()), whole);
}

TEST(Crc32c, MaskedFormIsTfRecords) {
  // TFRecord framing masks the CRC: rotate right by 15, add 0xa282ead8 (tensorflow/core/lib/hash/crc32c.h).
  // For "123456789": 0xE3069283 rotated is 0x2507C60D, plus the constant 0xC78AB0E5.
  const std::string text = "123456789";
  EXPECT_EQ(masked_crc32c(text.data(), text.size()), 0xC78AB0E5u);
}

}  // namespace
}  // namespace tandem
