// TensorBoard event files, written by hand (MMEngine's TensorboardVisBackend, without protobuf or
// TensorFlow): <dir>/events.out.tfevents.<unix seconds>.<hostname>, TensorBoard's own naming, a new
// file each run (a resumed run adds one, as TensorBoard's writers do; should that name be taken, by
// a run in the same second, ".1", ".2", ... follow it). The file is TFRecord framed:
// per record, the data's length (uint64, little-endian), the masked CRC-32C of those 8 bytes
// (uint32 LE), the data, the masked CRC-32C of the data (uint32 LE). Each record is a serialized
// tensorflow.Event (tensorboard/compat/proto/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first record is {wall_time, file_version "brain.Event:2"}; then one Event per add_scalars
// (wall_time, step, one Value per scalar), flushed at once, so a killed run leaves a readable file.
// Fields at their proto3 default (step 0) are omitted, as protobuf's own serializer does.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace tandem::train {

using TensorboardScalars = std::vector<std::pair<std::string, float>>;  // (tag, simple_value)

// The encodings (exposed for tests): one TFRecord around `data`; the first Event; a scalars Event.
std::string tfrecord(const std::string& data);
std::string tb_file_version_event(double wall_time);
std::string tb_scalars_event(double wall_time, int64_t step, const TensorboardScalars& scalars);

class TensorboardWriter {
 public:
  // Creates a new event file in `dir` and writes its file_version record.
  explicit TensorboardWriter(const std::string& dir);
  const std::string& path() const { return path_; }
  // One Event at `step` (wall_time now) holding `scalars`; flushed.
  void add_scalars(int64_t step, const TensorboardScalars& scalars);

 private:
  void write(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

}  // namespace tandem::train
