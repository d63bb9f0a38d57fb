// safetensors: round trips (every dtype, scalars, empty tensors, non-contiguous
// input, metadata), the on-disk layout (a hand-written file in the reference
// format loads; our header is 8-aligned and the data tiles the region), atomic
// save (failures leave the previous file and no temporary behind), and every
// malformed-file case with its message.
#include "core/safetensors.h"

#include <gtest/gtest.h>

#include "common/test_util.h"
#include <unistd.h>

#include <atomic>
#include <cstring>
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




// A file in the reference layout: u64 little-endian header length, header, data.
void write_raw(const std::string& p, const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  out += data;
  std::ofstream(p, std::ios::binary) << out;
}

std::string bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes());
}

}  // namespace

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir dir;
  TensorMap in;
  in["f32"] = Tensor::from_vector<float>({1.5f, -2.25f, 3e-8f, 1e30f, 0.f, -0.f}, {2, 3});
  in["f64"] = Tensor::from_vector<double>({3.141592653589793, -1e-300}, {2});
  in["f16"] = Tensor::from_vector<float>({0.5f, -65504.f, 1.f / 1024, 7.f}, {2, 2}).to(kFloat16);
  in["bf16"] = Tensor::from_vector<float>({1.f, -3.5f, 1e20f}, {3, 1}).to(kBFloat16);
  in["i64"] = Tensor::from_vector<int64_t>({INT64_MIN, -1, 0, INT64_MAX}, {4});
  in["i32"] = Tensor::from_vector<int32_t>({-7, 123456789}, {1, 2, 1});
  in["u8"] = Tensor::from_vector<uint8_t>({0, 1, 254, 255, 9}, {5});
  in["scalar"] = Tensor::scalar(42.0);
  in["empty"] = Tensor::empty({0, 3}, kInt32);
  const std::string p = dir.file("all.safetensors");
  save_safetensors(p, in);
  const TensorMap out = load_safetensors(p);
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out.count(name)) << name;
    const Tensor& r = out.at(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_TRUE(r.device().is_cpu());
    EXPECT_EQ(bytes_of(r), bytes_of(t)) << name;
  }
  EXPECT_EQ(out.at("f16").to(kFloat32).to_vector<float>(),
            (std::vector<float>{0.5f, -65504.f, 1.f / 1024, 7.f}));
  EXPECT_EQ(out.at("i64").to_vector<int64_t>()[0], INT64_MIN);
  EXPECT_TRUE(load_safetensors_metadata(p).empty());
}

TEST(Safetensors, NonContiguousInputSavedAsContiguous) {
  TempDir dir;
  Tensor base = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  TensorMap in;
  in["t"] = base.transpose(0, 1);    // [4, 3]
  in["s"] = base.slice(1, 1, 4, 2);  // [3, 2] columns 1 and 3
  in["row"] = base.select(0, 2);     // contiguous view with an offset
  const std::string p = dir.file("views.safetensors");
  save_safetensors(p, in);
  const TensorMap out = load_safetensors(p);
  EXPECT_EQ(out.at("t").shape(), (Shape{4, 3}));
  EXPECT_EQ(out.at("t").to_vector<float>(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(out.at("s").to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(out.at("row").to_vector<float>(), (std::vector<float>{8, 9, 10, 11}));
}

TEST(Safetensors, Metadata) {
  TempDir dir;
  const std::string p = dir.file("meta.safetensors");
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"epoch", "3"}, {"note", "quote \" ü"}};
  save_safetensors(p, {{"w", Tensor::ones({2})}}, meta);
  EXPECT_EQ(load_safetensors_metadata(p), meta);
  EXPECT_EQ(load_safetensors(p).size(), 1u);  // __metadata__ is not a tensor
  const SafetensorsFile both = load_safetensors_file(p);  // one pass: the same tensors and metadata
  EXPECT_EQ(both.metadata, meta);
  ASSERT_EQ(both.tensors.size(), 1u);
  EXPECT_EQ(both.tensors.at("w").to_vector<float>(), std::vector<float>({1.f, 1.f}));
}

TEST(Safetensors, LayoutIsTheReferenceFormat) {
  TempDir dir;
  const std::string p = dir.file("layout.safetensors");
  save_safetensors(p, {{"a", Tensor::from_vector<uint8_t>({1, 2, 3}, {3})},
                       {"b", Tensor::from_vector<double>({2.0}, {1})},
                       {"c", Tensor::from_vector<float>({1.f, 2.f}, {2})}});
  const std::string bytes = read_file(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.size(), 8 + n + 8 + 8 + 3);
  const std::string header = bytes.substr(8, n);
  // Largest element first: f64 at 0, f32 at 8, u8 at 16.
  EXPECT_HAS(header, R"("b":{"data_offsets":[0,8],"dtype":"F64","shape":[1]})");
  EXPECT_HAS(header, R"("c":{"data_offsets":[8,16],"dtype":"F32","shape":[2]})");
  EXPECT_HAS(header, R"("a":{"data_offsets":[16,19],"dtype":"U8","shape":[3]})");
  double b;
  std::memcpy(&b, bytes.data() + 8 + n, 8);
  EXPECT_EQ(b, 2.0);
}

TEST(Safetensors, LoadsHandWrittenReferenceFile) {
  TempDir dir;
  const std::string p = dir.file("ref.safetensors");
  // As the Python package writes it: metadata first, spaces padding to 8 bytes.
  std::string header =
      R"({"__metadata__":{"format":"pt"},"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("bias":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const float w[4] = {1.f, -2.f, 0.5f, 4.f};
  const int64_t bias = -9;
  std::string data(reinterpret_cast<const char*>(w), 16);
  data.append(reinterpret_cast<const char*>(&bias), 8);
  write_raw(p, header, data);
  const TensorMap m = load_safetensors(p);
  EXPECT_EQ(m.at("weight").shape(), (Shape{2, 2}));
  EXPECT_EQ(m.at("weight").to_vector<float>(), (std::vector<float>{1.f, -2.f, 0.5f, 4.f}));
  EXPECT_EQ(m.at("bias").to_vector<int64_t>(), (std::vector<int64_t>{-9}));
  EXPECT_EQ(load_safetensors_metadata(p).at("format"), "pt");
}

TEST(Safetensors, SaveIsAtomicAndFailuresAreClear) {
  TempDir dir;
  const std::string p = dir.file("ckpt.safetensors");
  save_safetensors(p, {{"w", Tensor::full({3}, 1.0)}});
  const std::string original = read_file(p);
  save_safetensors(p, {{"w", Tensor::full({3}, 2.0)}});  // overwrite
  EXPECT_EQ(load_safetensors(p).at("w").to_vector<float>(), (std::vector<float>{2, 2, 2}));

  // A failing save (undefined tensor) leaves the previous file untouched.
  const std::string before = read_file(p);
  EXPECT_HAS(error_of([&] { save_safetensors(p, {{"a", Tensor::ones({1})}, {"bad", Tensor()}}); }), "'bad'");
  EXPECT_EQ(read_file(p), before);

  // Unwritable location: the message names the path.
  const std::string missing = dir.file("no/such/dir/x.safetensors");
  EXPECT_HAS(error_of([&] { save_safetensors(missing, {{"w", Tensor::ones({1})}}); }), missing);

  // Rename fails (target is a directory): error, and no temporary left behind.
  fs::create_directories(dir.path() / "adir");
  EXPECT_HAS(error_of([&] { save_safetensors(dir.file("adir"), {{"w", Tensor::ones({1})}}); }), "adir");
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  EXPECT_HAS(error_of([&] { save_safetensors(p, {{"__metadata__", Tensor::ones({1})}}); }), "__metadata__");
  EXPECT_NE(original, before);
}

TEST(Safetensors, BadFiles) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  auto load_error = [&] { return error_of([&] { load_safetensors(p); }); };
  const std::string f32x2(8, '\0');

  std::ofstream(p, std::ios::binary) << "abc";
  std::string msg = load_error();
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "too short");

  {  // header length larger than the file
    std::string b(8, '\0');
    b[0] = static_cast<char>(200);
    std::ofstream(p, std::ios::binary) << b << "{}";
    msg = load_error();
    EXPECT_HAS(msg, p);
    EXPECT_HAS(msg, "header length 200");
  }

  write_raw(p, R"({"a": {"dtype": "F32", )", f32x2);
  msg = load_error();
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "invalid JSON");

  write_raw(p, R"([1, 2])", "");
  EXPECT_HAS(load_error(), "must be an object");

  write_raw(p, R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", "xx");
  msg = load_error();
  EXPECT_HAS(msg, "tensor 'a'");
  EXPECT_HAS(msg, "unknown dtype 'F8_E4M3'");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2);
  msg = load_error();
  EXPECT_HAS(msg, "tensor 'a'");
  EXPECT_HAS(msg, "needs 12 bytes");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234");
  msg = load_error();
  EXPECT_HAS(msg, "tensor 'a'");
  EXPECT_HAS(msg, "out of range");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32x2);
  EXPECT_HAS(load_error(), "out of range");

  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            f32x2);
  msg = load_error();
  EXPECT_HAS(msg, "overlaps");
  EXPECT_HAS(msg, "'a'");
  EXPECT_HAS(msg, "'b'");

  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            f32x2);
  msg = load_error();
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "duplicate name 'a'");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2);
  EXPECT_HAS(load_error(), "hole");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32x2);
  EXPECT_HAS(load_error(), "cover 4 bytes");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", f32x2);
  EXPECT_HAS(load_error(), "non-negative");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[2]}})", f32x2);
  EXPECT_HAS(load_error(), "data_offsets");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", f32x2);
  EXPECT_HAS(load_error(), "unexpected field 'extra'");

  write_raw(p, R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x2);
  msg = error_of([&] { load_safetensors_metadata(p); });
  EXPECT_HAS(msg, p);
  EXPECT_HAS(msg, "must be a string");

  EXPECT_HAS(error_of([&] { load_safetensors(dir.file("missing")); }), dir.file("missing"));
}
