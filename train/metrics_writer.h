// Metrics as JSON lines (one object per line, flushed as written), so a
// crashed run keeps everything up to its last line. Writes the same records to
// up to two files: the Runner's metrics_out and the work dir's <timestamp>.metrics.jsonl.
// append: keep what a file holds (a resumed run continues the earlier file).
#pragma once

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem::train {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  explicit MetricsWriter(const std::string& path, bool append = false) { add(path, append); }
  void add(const std::string& path, bool append) {
    if (path.empty()) return;
    auto out = std::make_unique<std::ofstream>(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
    TANDEM_CHECK(out->good(), "cannot write metrics file '", path, "'");
    outs_.push_back(std::move(out));
  }
  bool enabled() const { return !outs_.empty(); }
  void write(const nlohmann::json& record) {
    if (!enabled()) return;
    const std::string line = record.dump() + '\n';
    for (auto& out : outs_) {
      *out << line;
      out->flush();
    }
  }

 private:
  std::vector<std::unique_ptr<std::ofstream>> outs_;
};

}  // namespace tandem::train
