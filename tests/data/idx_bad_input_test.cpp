// Bad input for the IDX reader and MnistDataset (reliability brief R1): every
// corrupt variant is one tandem::Error naming the file and what was wrong,
// never a crash, a hang or a huge allocation. Covers wrong magic (every byte),
// zero dimensions, truncation at every header and data boundary, raw and gzip,
// corrupted compressed bytes, a gzip file whose header declares far more data
// than it could hold, and the dataset-level checks (image/label count, ranks,
// label range). The fuzz corpus under fuzz/corpus/idx holds the same kinds.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/error.h"
#include "data/idx.h"
#include "data/mnist.h"

using namespace tandem;
using tandem::test::error_of;
using tandem::test::TempDir;

namespace {

using Bytes = std::vector<uint8_t>;

void write_bytes(const std::string& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

Bytes gzip_bytes(const Bytes& raw) {
  uLongf cap = compressBound(static_cast<uLong>(raw.size())) + 64;
  Bytes out(cap);
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  zs.next_in = const_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// An IDX header for uint8 data of `dims`, followed by `data`.
Bytes idx(const std::vector<uint32_t>& dims, const Bytes& data, uint8_t type = 0x08) {
  Bytes b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes filled(size_t n, uint8_t v = 7) { return Bytes(n, v); }

}  // namespace

TEST(IdxBadInput, ZeroDimensionsIsBadMagic) {
  TempDir dir;
  const std::string p = dir.file("zero-dims");
  write_bytes(p, {0, 0, 8, 0});
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "bad magic");
  EXPECT_HAS(msg, "00 00 08 00");
}

TEST(IdxBadInput, EveryWrongMagicByteIsNamed) {
  TempDir dir;
  const std::string p = dir.file("magic");
  write_bytes(p, {1, 0, 8, 1, 0, 0, 0, 1, 5});
  EXPECT_HAS(error_of([&] { data::read_idx(p); }), "found bytes 01 00 08 01");
  write_bytes(p, {0, 0xff, 8, 1, 0, 0, 0, 1, 5});
  EXPECT_HAS(error_of([&] { data::read_idx(p); }), "found bytes 00 ff 08 01");
  write_bytes(p, idx({1}, {5}, 0x0D));
  const std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, "0x0d (float32)");
  EXPECT_HAS(msg, "only 0x08");
}

// Cutting a valid file at every length short of its end gives a "truncated"
// error, raw and gzip alike.
TEST(IdxBadInput, TruncatedAtEveryLength) {
  TempDir dir;
  const Bytes good = idx({2, 3, 2}, filled(12));
  for (size_t len = 0; len < good.size(); ++len) {
    const Bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    for (bool gz : {false, true}) {
      const std::string p = dir.file("cut-" + std::to_string(len) + (gz ? ".gz" : ""));
      write_bytes(p, gz ? gzip_bytes(cut) : cut);
      const std::string msg = error_of([&] { data::read_idx(p); });
      EXPECT_HAS(msg, p);
      EXPECT_HAS(msg, "truncated");
    }
  }
}

TEST(IdxBadInput, GzipCorruptedCompressedBytes) {
  TempDir dir;
  Bytes raw = idx({64, 64}, {});
  for (int i = 0; i < 64 * 64; ++i) raw.push_back(static_cast<uint8_t>(i * 2654435761u >> 24));
  const Bytes gz = gzip_bytes(raw);
  ASSERT_GT(gz.size(), 64u);
  // Flip bytes inside the deflate stream, in the CRC trailer, and in the length trailer.
  for (size_t pos : {size_t(20), gz.size() / 2, gz.size() - 6, gz.size() - 2}) {
    Bytes bad = gz;
    bad[pos] ^= 0x5a;
    const std::string p = dir.file("flip-" + std::to_string(pos) + ".gz");
    write_bytes(p, bad);
    const std::string msg = error_of([&] { data::read_idx(p); });
    EXPECT_HAS(msg, p);
    EXPECT_TRUE(msg.find("corrupt gzip") != std::string::npos || msg.find("truncated") != std::string::npos ||
                msg.find("bad magic") != std::string::npos)
        << msg;
  }
  // Only the gzip magic and garbage after it.
  const std::string p = dir.file("magic-only.gz");
  write_bytes(p, {0x1f, 0x8b, 0x08, 0x00, 0xde, 0xad, 0xbe, 0xef});
  EXPECT_HAS(error_of([&] { data::read_idx(p); }), p);
}

// A tiny gzip file whose IDX header declares terabytes must fail before any
// allocation of that size (the raw path checks the file length; the gzip path
// bounds it by deflate's maximum ratio).
TEST(IdxBadInput, GzipHeaderDeclaringHugeShapeFailsWithoutAllocating) {
  TempDir dir;
  const std::string p = dir.file("huge.gz");
  write_bytes(p, gzip_bytes(idx({60000, 60000, 60000}, filled(100))));
  std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "[60000, 60000, 60000]");
  EXPECT_HAS(msg, "cannot hold");

  const std::string q = dir.file("huge-raw");
  write_bytes(q, idx({60000, 60000, 60000}, filled(100)));
  msg = error_of([&] { data::read_idx(q); });
  EXPECT_HAS(msg, "truncated");

  const std::string r = dir.file("overflow");
  write_bytes(r, idx({0xffffffffu, 0xffffffffu, 0xffffffffu}, {}));
  EXPECT_HAS(error_of([&] { data::read_idx(r); }), "implausibly large");
}

// Found by fuzz_idx (fuzz/corpus/idx/regress_zero_dim_stride_overflow): a zero
// dimension made numel 0, so the other dimensions went unchecked and the
// tensor's strides overflowed int64 (UBSan: signed integer overflow).
TEST(IdxBadInput, ZeroDimensionDoesNotHideHugeOthers) {
  TempDir dir;
  const std::string p = dir.file("zero-and-huge");
  write_bytes(p, idx({0x07000000u, 0x7c, 0x96, 0, 0x96000000u, 0x7000000u, 0x7c}, {}));
  std::string msg = error_of([&] { data::read_idx(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "implausibly large");
  // A zero dimension with modest others is a valid empty tensor.
  write_bytes(p, idx({0, 28, 28}, {}));
  EXPECT_EQ(data::read_idx(p).shape(), (Shape{0, 28, 28}));
}

TEST(IdxBadInput, MnistCountMismatchAndShapes) {
  TempDir dir;
  data::MnistFiles f{dir.file("images"), dir.file("labels")};
  write_bytes(f.images, idx({3, 2, 2}, filled(12)));
  write_bytes(f.labels, idx({2}, {1, 2}));
  std::string msg = error_of([&] { data::MnistDataset ds(f); });
  EXPECT_HAS(msg, "count mismatch");
  EXPECT_HAS(msg, "3 images");
  EXPECT_HAS(msg, "2 labels");

  write_bytes(f.labels, idx({3, 1}, {1, 2, 3}));
  msg = error_of([&] { data::MnistDataset ds(f); });
  EXPECT_HAS(msg, f.labels);
  EXPECT_HAS(msg, "must hold [N]");

  write_bytes(f.labels, idx({3}, {1, 2, 3}));
  write_bytes(f.images, idx({12}, filled(12)));
  msg = error_of([&] { data::MnistDataset ds(f); });
  EXPECT_HAS(msg, f.images);
  EXPECT_HAS(msg, "[N, H, W]");

  write_bytes(f.images, idx({3, 2, 2}, filled(12)));
  write_bytes(f.labels, idx({3}, {1, 10, 3}));
  msg = error_of([&] { data::MnistDataset ds(f); });
  EXPECT_HAS(msg, "label at index 1 is 10");

  // Swapped files: the label file given as images.
  write_bytes(f.labels, idx({3}, {1, 2, 3}));
  data::MnistFiles swapped{f.labels, f.images};
  msg = error_of([&] { data::MnistDataset ds(swapped); });
  EXPECT_HAS(msg, f.labels);
  EXPECT_HAS(msg, "[N, H, W]");

  // A gzip-corrupted label file is named through the dataset too.
  Bytes gz = gzip_bytes(idx({3}, {1, 2, 3}));
  gz.resize(gz.size() - 5);
  write_bytes(f.labels, gz);
  EXPECT_HAS(error_of([&] { data::MnistDataset ds(f); }), f.labels);

  // Zero samples load (an empty split is not corrupt), and reading past them is an error.
  write_bytes(f.images, idx({0, 2, 2}, {}));
  write_bytes(f.labels, idx({0}, {}));
  data::MnistDataset empty(f);
  EXPECT_EQ(empty.size(), 0);
  data::Batch b;
  EXPECT_HAS(error_of([&] { empty.get_batch_into({0}, b); }), "out of range");
}

TEST(IdxBadInput, DirectoryInsteadOfFile) {
  TempDir dir;
  const std::string msg = error_of([&] { data::read_idx(dir.path().string()); });
  EXPECT_HAS(msg, dir.path().string());
}
