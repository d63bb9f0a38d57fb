// TensorboardVisBackend (train/tensorboard_writer.h): the encoding of one event byte for byte against
// bytes worked out by hand from the TFRecord framing and event.proto / summary.proto; a reader
// written here (framing, both CRCs, the protobuf fields) over a real training run's event file,
// whose scalars must be scalars.json's, and a resumed run's second file; unsupported vis backends
// refused in one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "train/tensorboard_writer.h"
#include "train/tiny_runner.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::string bytes(std::initializer_list<unsigned char> b) { return std::string(b.begin(), b.end()); }

// The Event {wall_time 1.5, step 3, summary {value {tag "loss", simple_value 0.25}}}, by hand:
//   09                       Event.wall_time: field 1, wire type 1 (fixed64) -> (1 << 3) | 1
//   00 00 00 00 00 00 f8 3f  1.5 as an IEEE double, little-endian (0x3ff8000000000000)
//   10 03                    Event.step: field 2, wire type 0 (varint) -> 0x10; 3
//   2a 0d                    Event.summary: field 5, wire type 2 -> 0x2a; 13 bytes follow
//     0a 0b                  Summary.value: field 1, wire type 2; 11 bytes follow
//       0a 04 6c 6f 73 73    Value.tag: field 1, wire type 2; 4 bytes "loss"
//       15 00 00 80 3e       Value.simple_value: field 2, wire type 5 (fixed32) -> 0x15; 0.25f = 0x3e800000
// 26 bytes in all. The record around it:
//   1a 00 00 00 00 00 00 00  the length, 26, as uint64 little-endian
//   12 9b d8 2d              masked CRC-32C of those 8 bytes: 0x2dd89b12
//   <the 26 bytes>
//   d0 54 b2 55              masked CRC-32C of the 26 bytes: 0x55b254d0
// The CRCs came from a table-driven CRC-32C written in Python apart from the engine (reflected
// polynomial 0x82f63b78, init and final xor 0xffffffff, checked on crc32c("123456789") = 0xe3069283),
// masked as ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2^32.
const std::string kScalarsEvent = bytes({0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x10, 0x03, 0x2a, 0x0d,
                                         0x0a, 0x0b, 0x0a, 0x04, 'l',  'o',  's',  's',  0x15, 0x00, 0x00, 0x80, 0x3e});
const std::string kScalarsRecord =
    bytes({0x1a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0x9b, 0xd8, 0x2d}) + kScalarsEvent +
    bytes({0xd0, 0x54, 0xb2, 0x55});
// The first Event {wall_time 1.5, file_version "brain.Event:2"}: 09 <1.5>, then 1a (field 3, wire
// type 2) 0d (13 bytes) "brain.Event:2"; 24 bytes. Length 0x18; masked CRCs 0x224b7fa3 (length) and
// 0x6c64282a (data), from the same Python.
const std::string kVersionRecord =
    bytes({0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f, 0x4b, 0x22, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00,
           0x00, 0xf8, 0x3f, 0x1a, 0x0d}) +
    "brain.Event:2" + bytes({0x2a, 0x28, 0x64, 0x6c});

TEST(Tensorboard, EncodesAnEventAndItsRecordAsWorkedOutByHand) {
  EXPECT_EQ(tb_scalars_event(1.5, 3, {{"loss", 0.25f}}), kScalarsEvent);
  EXPECT_EQ(tfrecord(kScalarsEvent), kScalarsRecord);
  EXPECT_EQ(tfrecord(tb_file_version_event(1.5)), kVersionRecord);
}

// --- A reader, from the spec, sharing nothing with the writer (its own bitwise CRC-32C too).

uint32_t masked_crc(const std::string& s) {
  uint32_t c = 0xffffffff;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  c ^= 0xffffffff;
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

template <typename T>
T le(const std::string& s, size_t at) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<unsigned char>(s.at(at + i))) << (8 * i);
  return v;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  bool has_summary = false;
  std::vector<std::pair<std::string, float>> values;
};

uint64_t varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<unsigned char>(s.at(at++));
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

// Calls f(field, wire type, at) for each field of message `s`; f consumes the field's value.
template <typename F>
void fields(const std::string& s, F&& f) {
  for (size_t at = 0; at < s.size();) {
    const uint64_t key = varint(s, at);
    f(static_cast<int>(key >> 3), static_cast<int>(key & 7), at);
  }
}

std::string length_delimited(const std::string& s, size_t& at) {
  const uint64_t n = varint(s, at);
  std::string out = s.substr(at, n);
  EXPECT_EQ(out.size(), n);
  at += n;
  return out;
}

std::pair<std::string, float> parse_value(const std::string& m) {
  std::pair<std::string, float> v{"", 0.f};
  fields(m, [&](int field, int wire, size_t& at) {
    if (field == 1 && wire == 2) {
      v.first = length_delimited(m, at);
    } else {
      ASSERT_TRUE(field == 2 && wire == 5) << "Value field " << field << " wire " << wire;
      const uint32_t bits = le<uint32_t>(m, at);
      std::memcpy(&v.second, &bits, 4);
      at += 4;
    }
  });
  return v;
}

Event parse_event(const std::string& m) {
  Event e;
  fields(m, [&](int field, int wire, size_t& at) {
    if (field == 1 && wire == 1) {
      const uint64_t bits = le<uint64_t>(m, at);
      std::memcpy(&e.wall_time, &bits, 8);
      at += 8;
    } else if (field == 2 && wire == 0) {
      e.step = static_cast<int64_t>(varint(m, at));
    } else if (field == 3 && wire == 2) {
      e.file_version = length_delimited(m, at);
    } else {
      ASSERT_TRUE(field == 5 && wire == 2) << "Event field " << field << " wire " << wire;
      e.has_summary = true;
      const std::string summary = length_delimited(m, at);
      fields(summary, [&](int f, int w, size_t& a) {
        ASSERT_TRUE(f == 1 && w == 2) << "Summary field " << f;
        e.values.push_back(parse_value(length_delimited(summary, a)));
      });
    }
  });
  return e;
}

// Every record of an event file, both CRCs checked.
std::vector<Event> read_events(const fs::path& file) {
  const std::string s = test::read_file(file);
  std::vector<Event> out;
  for (size_t at = 0; at < s.size();) {
    EXPECT_LE(at + 12, s.size()) << file << ": a record's header is cut at byte " << at;
    const std::string length = s.substr(at, 8);
    EXPECT_EQ(le<uint32_t>(s, at + 8), masked_crc(length)) << file << ": length CRC at byte " << at;
    const uint64_t n = le<uint64_t>(s, at);
    const std::string data = s.substr(at + 12, n);
    EXPECT_EQ(data.size(), n) << file << ": a record's data is cut at byte " << at;
    EXPECT_EQ(le<uint32_t>(s, at + 12 + n), masked_crc(data)) << file << ": data CRC at byte " << at;
    out.push_back(parse_event(data));
    at += 16 + n;
  }
  return out;
}

std::vector<fs::path> event_files(const std::string& work_dir) {
  std::vector<fs::path> out;
  for (const auto& f : fs::directory_iterator(work_dir + "/vis_data"))
    if (f.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(f.path());
  std::sort(out.begin(), out.end());  // seconds, then the same second's ".1", ".2"
  return out;
}

std::vector<nlohmann::json> scalars_json(const std::string& work_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(work_dir + "/vis_data/scalars.json");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The files' scalar events against scalars.json's records, one for one: the same step, each key but
// step as a tag holding its value as a float.
void expect_events_match_scalars(const std::vector<fs::path>& files, const std::string& work_dir) {
  std::vector<Event> scalars;
  for (const fs::path& f : files) {
    const std::vector<Event> events = read_events(f);
    ASSERT_FALSE(events.empty()) << f;
    EXPECT_EQ(events[0].file_version, "brain.Event:2") << f;
    EXPECT_FALSE(events[0].has_summary);
    EXPECT_GT(events[0].wall_time, 1.6e9);  // seconds since 1970: after 2020
    for (size_t i = 1; i < events.size(); ++i) {
      EXPECT_TRUE(events[i].has_summary && events[i].file_version.empty()) << f << " record " << i;
      EXPECT_GE(events[i].wall_time, events[i - 1].wall_time);
      scalars.push_back(events[i]);
    }
  }
  const std::vector<nlohmann::json> records = scalars_json(work_dir);
  ASSERT_EQ(scalars.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const nlohmann::json& r = records[i];
    EXPECT_EQ(scalars[i].step, r["step"].get<int64_t>()) << r.dump();
    if (i > 0) {
      EXPECT_GE(scalars[i].step, scalars[i - 1].step);  // a validation shares its iteration's step
    }
    ASSERT_EQ(scalars[i].values.size(), r.size() - 1) << r.dump();  // every key but step
    for (const auto& [tag, value] : scalars[i].values) {
      ASSERT_TRUE(r.contains(tag)) << tag << " not in " << r.dump();
      EXPECT_EQ(value, r[tag].get<float>()) << tag << " in " << r.dump();
    }
  }
}

TEST(Tensorboard, ARealRunsEventFileHoldsScalarsJsonsValuesAndAResumeAddsAFile) {
  TempDir tmp("tensorboard");
  const std::string dir = tmp.file("w");
  RunnerOptions o = tiny_options(dir);
  o.vis_backends = {"LocalVisBackend", "TensorboardVisBackend"};
  o.log_interval = 1;
  o.checkpoint_interval_epochs = 1;
  Runner(o).train();  // one epoch of 4 iterations and its validation
  std::vector<fs::path> files = event_files(dir);
  ASSERT_EQ(files.size(), 1u);
  expect_events_match_scalars(files, dir);
  const std::vector<nlohmann::json> first = scalars_json(dir);
  ASSERT_EQ(first.size(), 5u);  // 4 progress records, then the validation's
  for (const char* k : {"loss", "lr", "base_lr", "time", "data_time", "memory"}) EXPECT_TRUE(first[0].contains(k)) << k;
  EXPECT_TRUE(first[4].contains("accuracy/top1")) << first[4].dump();
  const std::vector<Event> events = read_events(files[0]);
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[4].step, 4);
  EXPECT_EQ(events[5].step, 4);

  RunnerOptions more = o;
  more.max_epochs = 2;
  more.resume = "auto";
  Runner(more).train();
  files = event_files(dir);
  ASSERT_EQ(files.size(), 2u);  // the resumed run's own file
  expect_events_match_scalars(files, dir);
  EXPECT_EQ(read_events(files[1]).back().step, 8);
}

TEST(Tensorboard, TensorboardAloneWritesNoScalarsJsonAndNoBackendsNoVisData) {
  TempDir tmp("tensorboard");
  RunnerOptions o = tiny_options(tmp.file("tb"));
  o.vis_backends = {"TensorboardVisBackend"};
  Runner(o).train();
  EXPECT_EQ(event_files(tmp.file("tb")).size(), 1u);
  EXPECT_FALSE(fs::exists(tmp.file("tb") + "/vis_data/scalars.json"));
  RunnerOptions none = tiny_options(tmp.file("none"));
  none.vis_backends = {};
  Runner(none).train();
  EXPECT_FALSE(fs::exists(tmp.file("none") + "/vis_data"));
}

TEST(Tensorboard, AnUnsupportedVisBackendIsRefusedInOneLineNamingTheSupportedOnes) {
  TempDir tmp("tensorboard");
  RunnerOptions o = tiny_options(tmp.file("w"));
  o.vis_backends = {"LocalVisBackend", "WandbVisBackend"};
  const std::string msg = test::error_of([&] { Runner r(o); });
  // The whole message, on one line, with no source tag (Error::where() holds that).
  EXPECT_EQ(msg, "visualizer.vis_backends[1]: vis backend 'WandbVisBackend' is not supported by Tandem "
                 "(supported: LocalVisBackend, TensorboardVisBackend); remove it or use one of those");
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  o.vis_backends = {"TensorboardVisBackend", "TensorboardVisBackend"};
  EXPECT_HAS(test::error_of([&] { Runner r(o); }),
             "visualizer.vis_backends[1]: vis backend 'TensorboardVisBackend' is listed twice; give each vis backend "
             "once");
}

}  // namespace
}  // namespace tandem::train
