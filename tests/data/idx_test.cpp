// IDX reader/writer: good raw and gzip files (gzip detected by content, not
// name), and the error messages for truncated, over-long, bad-magic,
// unsupported-type and missing files.
#include "data/idx.h"

#include <gtest/gtest.h>

#include "common/test_util.h"
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

using namespace tandem;
namespace fs = std::filesystem;

using tandem::test::TempDir;
using tandem::test::error_of;
using tandem::test::read_file;

namespace {


std::vector<uint8_t> read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), b.size());
}
void write_gz(const std::string& p, const std::vector<uint8_t>& b) {
  gzFile g = gzopen(p.c_str(), "wb");
  ASSERT_NE(g, nullptr);
  if (!b.empty()) {
    ASSERT_EQ(gzwrite(g, b.data(), static_cast<unsigned>(b.size())), int(b.size()));
  }
  gzclose(g);
}


Tensor sample_tensor() {
  std::vector<uint8_t> v(3 * 2 * 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 11 % 256);
  return Tensor::from_vector<uint8_t>(v, {3, 2, 4});
}

}  // namespace

TEST(Idx, WriteThenReadRaw) {
  TempDir dir;
  const std::string p = dir.file("x-idx3-ubyte");
  Tensor t = sample_tensor();
  data::write_idx(p, t);
  const std::vector<uint8_t> bytes = read_bytes(p);
  ASSERT_EQ(bytes.size(), 4u + 12u + 24u);
  EXPECT_EQ((std::vector<uint8_t>(bytes.begin(), bytes.begin() + 8)),
            (std::vector<uint8_t>{0, 0, 8, 3, 0, 0, 0, 3}));
  Tensor r = data::read_idx(p);
  EXPECT_EQ(r.dtype(), kUInt8);
  EXPECT_EQ(r.shape(), (Shape{3, 2, 4}));
  EXPECT_EQ(r.to_vector<uint8_t>(), t.to_vector<uint8_t>());
}

TEST(Idx, WriteNonContiguous) {
  TempDir dir;
  Tensor t = sample_tensor().transpose(0, 2);  // [4, 2, 3]
  data::write_idx(dir.file("t"), t);
  Tensor r = data::read_idx(dir.file("t"));
  EXPECT_EQ(r.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(r.to_vector<uint8_t>(), t.contiguous().to_vector<uint8_t>());
}

TEST(Idx, ReadGzipDetectedByContent) {
  TempDir dir;
  Tensor t = sample_tensor();
  data::write_idx(dir.file("raw"), t);
  const std::vector<uint8_t> bytes = read_bytes(dir.file("raw"));
  // gzip content under a name without .gz, raw content under a name with .gz
  write_gz(dir.file("compressed-no-suffix"), bytes);
  write_bytes(dir.file("plain.gz"), bytes);
  EXPECT_EQ(read_bytes(dir.file("compressed-no-suffix"))[0], 0x1f);
  for (const char* name : {"compressed-no-suffix", "plain.gz"}) {
    Tensor r = data::read_idx(dir.file(name));
    EXPECT_EQ(r.shape(), (Shape{3, 2, 4})) << name;
    EXPECT_EQ(r.to_vector<uint8_t>(), t.to_vector<uint8_t>()) << name;
  }
}

TEST(Idx, OneDimensionalLabels) {
  TempDir dir;
  Tensor t = Tensor::from_vector<uint8_t>({7, 2, 1, 0, 4}, {5});
  data::write_idx(dir.file("l.gz"), t);
  Tensor r = data::read_idx(dir.file("l.gz"));
  EXPECT_EQ(r.shape(), (Shape{5}));
  EXPECT_EQ(r.to_vector<uint8_t>(), (std::vector<uint8_t>{7, 2, 1, 0, 4}));
}

TEST(Idx, TruncatedRawNamesFileAndSizes) {
  TempDir dir;
  const std::string p = dir.file("trunc-idx3-ubyte");
  data::write_idx(p, sample_tensor());  // 40 bytes
  fs::resize_file(p, 30);
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "truncated");
  EXPECT_HAS(msg, "40 bytes");
  EXPECT_HAS(msg, "30 bytes");
}

TEST(Idx, TruncatedHeader) {
  TempDir dir;
  const std::string p = dir.file("short");
  write_bytes(p, {0, 0, 8, 3, 0, 0, 0});  // three dims need 16 header bytes
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "16 bytes");
  EXPECT_HAS(msg, "7 bytes");
}

TEST(Idx, LongerThanHeaderSays) {
  TempDir dir;
  const std::string p = dir.file("long");
  std::vector<uint8_t> b = {0, 0, 8, 1, 0, 0, 0, 2, 5, 6, 7};  // 2 elements + 1 extra byte
  write_bytes(p, b);
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "10 bytes");
  EXPECT_HAS(msg, "11 bytes");
}

TEST(Idx, TruncatedGzipReportsDecompressedLength) {
  TempDir dir;
  data::write_idx(dir.file("raw"), sample_tensor());
  std::vector<uint8_t> bytes = read_bytes(dir.file("raw"));
  bytes.resize(25);  // header says 40 bytes
  const std::string p = dir.file("trunc.gz");
  write_gz(p, bytes);
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "decompressed length is 25 bytes");
  EXPECT_HAS(msg, "40 bytes");
}

TEST(Idx, CutGzipStreamIsAnError) {
  TempDir dir;
  // Incompressible-ish content so the compressed stream is long enough to cut.
  std::vector<uint8_t> v(4096);
  uint32_t x = 12345;
  for (auto& b : v) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  data::write_idx(dir.file("raw"), Tensor::from_vector<uint8_t>(v, {4096}));
  const std::string p = dir.file("cut.gz");
  write_gz(p, read_bytes(dir.file("raw")));
  fs::resize_file(p, fs::file_size(p) / 2);
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "4104 bytes");  // what the header promised
}

TEST(Idx, GzipWithTrailingData) {
  TempDir dir;
  const std::string p = dir.file("long.gz");
  write_gz(p, {0, 0, 8, 1, 0, 0, 0, 2, 5, 6, 7, 8, 9});
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, "decompressed length is 13 bytes");
  EXPECT_HAS(msg, "10 bytes");
}

TEST(Idx, BadMagicNamesFileAndBytes) {
  TempDir dir;
  const std::string p = dir.file("bad");
  write_bytes(p, {0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0});
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "12 34 56 78");
  EXPECT_HAS(msg, "magic");
}

TEST(Idx, BadMagicInsideGzip) {
  TempDir dir;
  const std::string p = dir.file("bad.gz");
  write_gz(p, {0xde, 0xad, 0xbe, 0xef, 1, 2, 3});
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, "de ad be ef");
}

TEST(Idx, UnsupportedElementType) {
  TempDir dir;
  const std::string p = dir.file("float");
  write_bytes(p, {0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0});
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "0x0d");
  EXPECT_HAS(msg, "float32");
}

TEST(Idx, MissingFileAndEmptyFile) {
  TempDir dir;
  EXPECT_HAS(error_of([&] { data::read_idx(dir.file("nope")); }), dir.file("nope"));
  write_bytes(dir.file("empty"), {});
  const std::string msg = error_of([&] { data::read_idx(dir.file("empty")); });
  EXPECT_HAS(msg, dir.file("empty"));
  EXPECT_HAS(msg, "0 bytes");
}

TEST(Idx, WriteRejectsNonUInt8) {
  TempDir dir;
  EXPECT_HAS(error_of([&] { data::write_idx(dir.file("f"), Tensor::zeros({2})); }), "uint8");
}
