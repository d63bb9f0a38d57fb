// TensorBoard event files (see tensorboard_writer.h): protobuf's wire format by hand. A field is a
// key varint (field number << 3 | wire type) and its value: wire type 0 a varint (int64), 1 eight
// little-endian bytes (double), 2 a varint length and the bytes (string, sub-message), 5 four
// little-endian bytes (float).
#include "train/tensorboard_writer.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/checksum.h"
#include "core/error.h"

namespace tandem::train {
namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_le(std::string& out, T v) {  // T: an unsigned integer
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }

void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 1);
  put_le(out, bits);
}

void put_float(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, 5);
  put_le(out, bits);
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

std::string tfrecord(const std::string& data) {
  std::string out;
  put_le<uint64_t>(out, data.size());
  const uint32_t length_crc = masked_crc32c(out.data(), out.size());
  put_le(out, length_crc);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::string tb_file_version_event(double wall_time) {
  std::string event;
  put_double(event, 1, wall_time);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string tb_scalars_event(double wall_time, int64_t step, const TensorboardScalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_float(v, 2, value);
    put_bytes(summary, 1, v);  // Summary.value
  }
  std::string event;
  put_double(event, 1, wall_time);
  if (step != 0) {
    put_key(event, 2, 0);
    put_varint(event, static_cast<uint64_t>(step));  // int64: two's complement, as protobuf's
  }
  put_bytes(event, 5, summary);
  return event;
}

TensorboardWriter::TensorboardWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const double now = now_seconds();
  const std::string name = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + hostname();
  path_ = name;  // a run in the same second on the same host (a quick resume) takes the next free suffix
  for (int n = 1; std::filesystem::exists(path_); ++n) path_ = name + "." + std::to_string(n);
  out_.open(path_, std::ios::out | std::ios::trunc | std::ios::binary);
  TANDEM_CHECK(out_.good(), "TensorboardVisBackend: cannot write the event file '", path_,
               "'; expected a writable <work_dir>/vis_data (check the work dir's permissions and free space)");
  write(tb_file_version_event(now));
}

void TensorboardWriter::add_scalars(int64_t step, const TensorboardScalars& scalars) {
  write(tb_scalars_event(now_seconds(), step, scalars));
}

void TensorboardWriter::write(const std::string& event) {
  out_ << tfrecord(event);
  out_.flush();
  TANDEM_CHECK(out_.good(), "TensorboardVisBackend: writing the event file '", path_,
               "' failed; expected a writable <work_dir>/vis_data (is the disk full?)");
}

}  // namespace tandem::train
