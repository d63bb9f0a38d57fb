// The safetensors checksums (core/safetensors.h): save_safetensors stores a CRC-32C per tensor and
// one over the header in __metadata__["tandem.crc32c"]; loading refuses every single-bit change
// anywhere in the file (each byte, three bit positions), names the tensor whose data changed, and
// refuses a checksum table under a damaged key; a file without the table loads, warning once per path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/test_util.h"
#include "core/checksum.h"
#include "core/safetensors.h"

using namespace tandem;
using tandem::test::error_of;
using tandem::test::read_file;
using tandem::test::TempDir;

namespace {

void write_bytes(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// The file's JSON header text (without the padding) and where its data region starts.
std::pair<std::string, size_t> header_of(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  std::string text = bytes.substr(8, n);
  text.erase(text.find_last_not_of(' ') + 1);
  return {text, 8 + n};
}

TensorMap sample() {
  return {{"w", Tensor::from_vector<float>({1.5f, -2.f, 3.25f, 4.f, 5.f, 6.f}, {3, 2})},
          {"b", Tensor::from_vector<int64_t>({7, 8}, {2})},
          {"u", Tensor::from_vector<uint8_t>({1, 2, 3}, {3})}};
}

// Captures what the process writes to its standard output and error (the log's sinks) while alive.
class LogCapture {
 public:
  explicit LogCapture(const std::string& file) : file_(file) {
    std::fflush(stdout);
    std::fflush(stderr);
    saved_out_ = ::dup(1);
    saved_err_ = ::dup(2);
    std::FILE* f = std::fopen(file.c_str(), "w");
    ::dup2(::fileno(f), 1);
    ::dup2(::fileno(f), 2);
    std::fclose(f);
  }
  ~LogCapture() { restore(); }
  std::string text() {
    std::fflush(stdout);
    std::fflush(stderr);
    return read_file(file_);
  }
  void restore() {
    if (saved_out_ < 0) return;
    std::fflush(stdout);
    std::fflush(stderr);
    ::dup2(saved_out_, 1);
    ::dup2(saved_err_, 2);
    ::close(saved_out_);
    ::close(saved_err_);
    saved_out_ = saved_err_ = -1;
  }

 private:
  std::string file_;
  int saved_out_ = -1, saved_err_ = -1;
};

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(SafetensorsChecksum, SaveStoresACrcPerTensorAndOneOverTheHeader) {
  TempDir dir;
  const std::string p = dir.file("c.safetensors");
  save_safetensors(p, sample(), {{"step", "7"}});
  const auto [text, data_start] = header_of(read_file(p));
  const nlohmann::json h = nlohmann::json::parse(text);
  const nlohmann::json table = nlohmann::json::parse(h.at("__metadata__").at(kChecksumMetadataKey).get<std::string>());
  ASSERT_EQ(table.size(), 4u) << table.dump();  // w, b, u and __header__
  const std::string bytes = read_file(p);
  for (const char* name : {"w", "b", "u"}) {
    const auto offsets = h.at(name).at("data_offsets");
    const size_t begin = data_start + offsets[0].get<size_t>(), end = data_start + offsets[1].get<size_t>();
    EXPECT_EQ(table.at(name).get<std::string>(), crc32c_hex(crc32c(bytes.data() + begin, end - begin))) << name;
  }
  nlohmann::json rest = h, tensors = table;
  tensors.erase("__header__");
  rest["__metadata__"][kChecksumMetadataKey] = tensors.dump();
  const std::string canonical = rest.dump();
  EXPECT_EQ(table.at("__header__").get<std::string>(), crc32c_hex(crc32c(canonical.data(), canonical.size())));
  // The table is the file's own: the metadata read back is the caller's, and the tensors round-trip.
  EXPECT_EQ(load_safetensors_metadata(p), (std::map<std::string, std::string>{{"step", "7"}}));
  const TensorMap back = load_safetensors(p);
  EXPECT_EQ(back.at("w").to_vector<float>(), sample().at("w").to_vector<float>());
  EXPECT_EQ(back.at("b").to_vector<int64_t>(), (std::vector<int64_t>{7, 8}));
  // Saving again what was loaded (metadata included) gives the same file.
  save_safetensors(dir.file("again.safetensors"), back, load_safetensors_metadata(p));
  EXPECT_EQ(read_file(dir.file("again.safetensors")), bytes);
  EXPECT_HAS(error_of([&] { save_safetensors(p, sample(), {{kChecksumMetadataKey, "x"}}); }), kChecksumMetadataKey);
}

TEST(SafetensorsChecksum, EverySingleBitChangeAnywhereIsRefused) {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  for (const bool with_metadata : {false, true}) {
    save_safetensors(good, sample(),
                     with_metadata ? std::map<std::string, std::string>{{"tandem", R"({"epoch":2})"}}
                                   : std::map<std::string, std::string>{});
    const std::string bytes = read_file(good);
    const size_t data_start = header_of(bytes).second;
    const std::string p = dir.file("flipped.safetensors");
    for (size_t at = 0; at < bytes.size(); ++at) {
      for (const uint8_t bit : {0x01, 0x20, 0x80}) {
        std::string b = bytes;
        b[at] = static_cast<char>(static_cast<uint8_t>(b[at]) ^ bit);
        write_bytes(p, b);
        bool refused = false;
        try {
          load_safetensors(p);
        } catch (const SafetensorsError& e) {
          refused = true;
          EXPECT_EQ(e.path(), p);
          EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
          // A changed data byte is named by its tensor and the failed CRC.
          if (at >= data_start) {
            EXPECT_HAS(std::string(e.what()), "fails its CRC-32C check");
            EXPECT_FALSE(e.tensor().empty()) << e.what();
          }
        }
        EXPECT_TRUE(refused) << "byte " << at << " ^ " << int(bit) << " was accepted";
        // The header alone is refused as well when the change is in it.
        if (at < data_start) {
          EXPECT_THROW(load_safetensors_metadata(p), SafetensorsError) << "byte " << at << " ^ " << int(bit);
        }
      }
    }
  }
}

TEST(SafetensorsChecksum, ADataChangeNamesTheTensorAndBothCrcs) {
  TempDir dir;
  const std::string p = dir.file("c.safetensors");
  save_safetensors(p, sample());
  std::string bytes = read_file(p);
  const auto [text, data_start] = header_of(bytes);
  const size_t w_begin = nlohmann::json::parse(text).at("w").at("data_offsets")[0].get<size_t>();
  bytes[data_start + w_begin + 3] ^= 0x40;
  write_bytes(p, bytes);
  const std::string msg = error_of([&] { load_safetensors(p); });
  EXPECT_HAS(msg, "safetensors file '" + p + "', tensor 'w': its data fails its CRC-32C check (stored ");
  EXPECT_HAS(msg, ", computed ");
  EXPECT_HAS(error_of([&] { load_safetensors_file(p); }), "tensor 'w': its data fails its CRC-32C check")
      << "the one-pass loader checks as load_safetensors does";
}

TEST(SafetensorsChecksum, AFileWithoutChecksumsLoadsWithANoticeOncePerFile) {
  TempDir dir;
  // Written as before checksums (and as other tools write it): no "tandem.crc32c".
  const std::string header = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(uint64_t(header.size()) >> (8 * i));
  const float values[2] = {1.f, 2.f};
  const std::string p = dir.file("old.safetensors");
  write_bytes(p, len + header + std::string(reinterpret_cast<const char*>(values), 8));
  LogCapture log(dir.file("log.txt"));
  const TensorMap m = load_safetensors(p);
  const auto metadata = load_safetensors_metadata(p);
  load_safetensors(p);
  const std::string out = log.text();
  // A file with checksums says nothing.
  save_safetensors(dir.file("new.safetensors"), m);
  load_safetensors(dir.file("new.safetensors"));
  const std::string after = log.text();
  log.restore();
  EXPECT_EQ(m.at("w").to_vector<float>(), (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(metadata.at("format"), "pt");
  EXPECT_EQ(count(out, "carries no CRC-32C checksums"), 1u) << out;
  EXPECT_HAS(out, "safetensors file '" + p + "' carries no CRC-32C checksums");
  EXPECT_EQ(test::lines_in(out), 1u) << out;
  EXPECT_EQ(after, out);
}

TEST(SafetensorsChecksum, AChecksumTableUnderADamagedKeyIsRefused) {
  TempDir dir;
  const std::string p = dir.file("c.safetensors");
  save_safetensors(p, sample());
  std::string bytes = read_file(p);
  const size_t at = bytes.find(kChecksumMetadataKey);
  ASSERT_NE(at, std::string::npos);
  bytes[at] = 'T';  // "Tandem.crc32c": the file must not pass as one without checksums
  write_bytes(p, bytes);
  LogCapture log(dir.file("log.txt"));
  const std::string msg = error_of([&] { load_safetensors(p); });
  EXPECT_HAS(msg, "holds a checksum table but is not named \"tandem.crc32c\"");
  const std::string logged = log.text();
  log.restore();
  EXPECT_EQ(logged, "");
}

// The fuzzer's seed fuzz/corpus/safetensors/checksummed was written by a short Python script from
// safetensors.h's description alone (json.dumps with sorted keys, no spaces): it verifies.
TEST(SafetensorsChecksum, AFileWrittenFromTheDocumentedFormatVerifies) {
  const std::string p = TANDEM_SOURCE_DIR "/fuzz/corpus/safetensors/checksummed";
  TempDir dir;
  LogCapture log(dir.file("log.txt"));
  const TensorMap m = load_safetensors(p);
  const std::string logged = log.text();
  log.restore();
  EXPECT_EQ(logged, "");  // it has checksums: no notice
  EXPECT_EQ(m.at("w").to_vector<float>(), (std::vector<float>{1.5f, -2.f, 3.25f, 4.f}));
  EXPECT_EQ(m.at("b").to_vector<int64_t>(), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(load_safetensors_metadata(p), (std::map<std::string, std::string>{{"step", "7"}}));
}
