// Bad input for the safetensors reader (reliability brief R1), beyond the
// basic cases in safetensors_test.cpp: truncation at every length of a valid
// file, header length beyond the file and beyond the 100 MB limit, header not
// JSON / not UTF-8 / deeply nested, unknown dtype, element counts whose byte
// size overflows 64 bits, offsets overlapping, outside or leaving holes,
// duplicate and empty names. Each is one tandem::Error naming the file, never
// a crash or a huge allocation. fuzz/corpus/safetensors holds the same kinds.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "common/test_util.h"
#include "core/error.h"
#include "core/safetensors.h"

using namespace tandem;
using tandem::test::error_of;
using tandem::test::read_file;
using tandem::test::TempDir;

namespace {

std::string with_length(uint64_t n, const std::string& rest) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + rest;
}

void write_text(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

void write_st(const std::string& p, const std::string& header, const std::string& data) {
  write_text(p, with_length(header.size(), header + data));
}

std::string load_error(const std::string& p) { return error_of([&] { load_safetensors(p); }); }

}  // namespace

TEST(SafetensorsBadInput, TruncatedAtEveryLength) {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  save_safetensors(good, {{"w", Tensor::ones({3, 2})}, {"b", Tensor::zeros({2}, kInt64)}}, {{"step", "7"}});
  const std::string bytes = read_file(good);
  ASSERT_EQ(load_safetensors(good).size(), 2u);
  const std::string p = dir.file("cut.safetensors");
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_text(p, bytes.substr(0, len));
    const std::string msg = load_error(p);
    EXPECT_HAS(msg, p);
  }
}

TEST(SafetensorsBadInput, HeaderLengthBeyondFileOrLimit) {
  TempDir dir;
  const std::string p = dir.file("len.safetensors");
  write_text(p, with_length(~uint64_t(0), "{}"));
  std::string msg = load_error(p);
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "larger than the file");

  write_text(p, with_length(3, "{}"));
  EXPECT_HAS(load_error(p), "larger than the file");

  // Exactly the file: "{}" plus nothing; an empty header object is a valid empty file.
  write_text(p, with_length(2, "{}"));
  EXPECT_TRUE(load_safetensors(p).empty());

  write_text(p, with_length(0, ""));
  EXPECT_HAS(load_error(p), "invalid JSON");
}

TEST(SafetensorsBadInput, HeaderNotJson) {
  TempDir dir;
  const std::string p = dir.file("json.safetensors");
  for (const std::string& h : {std::string("not json at all"), std::string("{\"a\": \"\xff\xfe\"}"),
                              std::string("{\"a\":1} trailing"), std::string(1, '\0'), std::string("\"str\"")}) {
    write_st(p, h, "");
    const std::string msg = load_error(p);
    EXPECT_HAS(msg, p);
    EXPECT_TRUE(msg.find("invalid JSON") != std::string::npos || msg.find("must be an object") != std::string::npos)
        << msg;
  }
  // Nesting a million levels deep: parsed without recursion, reported without dumping it.
  const std::string deep = R"({"a":{"dtype":"F32","shape":[)" + std::string(1'000'000, '[') +
                           std::string(1'000'000, ']') + R"(],"data_offsets":[0,0]}})";
  write_st(p, deep, "");
  std::string msg = load_error(p);
  EXPECT_HAS(msg, "tensor 'a'");
  EXPECT_HAS(msg, "non-negative integers, got an array");
  EXPECT_LT(msg.size(), 1000u);
}

TEST(SafetensorsBadInput, UnknownOrWrongTypedFields) {
  TempDir dir;
  const std::string p = dir.file("fields.safetensors");
  write_st(p, R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", "1234");
  EXPECT_HAS(load_error(p), "unknown dtype 'f32'");
  write_st(p, R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "1234");
  EXPECT_HAS(load_error(p), "non-string \"dtype\"");
  write_st(p, R"({"a":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", "1234");
  EXPECT_HAS(load_error(p), "non-array \"shape\"");
  write_st(p, R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "1234");
  EXPECT_HAS(load_error(p), "non-negative integers, got 1.5");
  write_st(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "1234");
  EXPECT_HAS(load_error(p), "[begin, end]");
  write_st(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", "1234");
  EXPECT_HAS(load_error(p), "data_offsets must hold non-negative integers");
  write_st(p, R"({"a":[1,2]})", "");
  EXPECT_HAS(load_error(p), "entry must be an object, got array");
  write_st(p, R"({"__metadata__":[1]})", "");
  EXPECT_HAS(load_error(p), "__metadata__ must be an object");
}

// Element counts whose byte size wraps around 2^64 must not pass as "0 bytes"
// (that would allocate an exabyte tensor); counts beyond the data are refused
// before any allocation.
TEST(SafetensorsBadInput, ByteCountOverflowAndMismatch) {
  TempDir dir;
  const std::string p = dir.file("overflow.safetensors");
  // 2^61 F64 elements = 2^64 bytes, which wraps to 0 == end - begin.
  write_st(p, R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", "");
  std::string msg = load_error(p);
  EXPECT_HAS(msg, "tensor 'a'");
  EXPECT_HAS(msg, "needs 2305843009213693952 elements of 8 bytes, more than the data region");
  // 2^30 x 2^30 x 4 elements of 4 bytes also wrap.
  write_st(p, R"({"a":{"dtype":"F32","shape":[1073741824,1073741824,4],"data_offsets":[0,0]}})", "");
  EXPECT_HAS(load_error(p), "more than the data region");
  write_st(p, R"({"a":{"dtype":"U8","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", "");
  EXPECT_HAS(load_error(p), "too large");
  // A zero dimension must not hide huge others (their product is the empty tensor's strides).
  write_st(p, R"({"a":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", "");
  EXPECT_HAS(load_error(p), "too large");
  write_st(p, R"({"a":{"dtype":"U8","shape":[0,1024,1024],"data_offsets":[0,0]}})", "");
  EXPECT_EQ(load_safetensors(p).at("a").shape(), (Shape{0, 1024, 1024}));
  write_st(p, R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", "12345678");
  msg = load_error(p);
  EXPECT_HAS(msg, "needs 16 bytes, more than the data region of 8 bytes");
  write_st(p, R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,8]}})", "12345678");
  EXPECT_HAS(load_error(p), "needs 4 bytes but data_offsets [0, 8] span 8");
}

TEST(SafetensorsBadInput, OffsetsOverlapOutsideOrHoles) {
  TempDir dir;
  const std::string p = dir.file("offsets.safetensors");
  const std::string d8(8, 'x');
  // Two tensors on the same bytes.
  write_st(p,
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           d8 + d8);
  EXPECT_HAS(load_error(p), "overlaps");
  // One inside another.
  write_st(p,
           R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
           R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
           d8);
  EXPECT_HAS(load_error(p), "overlaps");
  // Past the end, and with an offset near 2^64 (begin + size must not wrap).
  write_st(p, R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})", d8);
  EXPECT_HAS(load_error(p), "out of range");
  write_st(p, R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[18446744073709551608,0]}})", d8);
  EXPECT_HAS(load_error(p), "out of range");
  write_st(p, R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,18446744073709551615]}})", d8);
  EXPECT_HAS(load_error(p), "out of range");
  // A hole at the start; unclaimed bytes at the end.
  write_st(p, R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", d8);
  EXPECT_HAS(load_error(p), "hole");
  write_st(p, R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", d8);
  EXPECT_HAS(load_error(p), "cover 4 bytes");
}

TEST(SafetensorsBadInput, DuplicateAndEmptyNames) {
  TempDir dir;
  const std::string p = dir.file("names.safetensors");
  write_st(p,
           R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
           R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
           "x");
  EXPECT_HAS(load_error(p), "duplicate name 'w'");
  // Duplicate keys inside one entry are caught too.
  write_st(p, R"({"w":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", "x");
  EXPECT_HAS(load_error(p), "duplicate name 'dtype'");
  write_st(p, R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  EXPECT_HAS(load_error(p), "empty name");
  // The same name in metadata and as a tensor is fine (separate objects).
  write_st(p, R"({"__metadata__":{"w":"1"},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  EXPECT_EQ(load_safetensors(p).count("w"), 1u);
}

TEST(SafetensorsBadInput, NotARegularFile) {
  TempDir dir;
  const std::string msg = load_error(dir.path().string());
  EXPECT_HAS(msg, dir.path().string());
}
