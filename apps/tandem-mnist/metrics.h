// Metrics as JSON lines (one object per line, flushed as written), so a
// crashed run keeps everything up to its last line.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace tandem::app {

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path) {
    if (path.empty()) return;
    out_.open(path, std::ios::out | std::ios::trunc);
    TANDEM_CHECK(out_.good(), "cannot write metrics file '", path, "'");
  }
  bool enabled() const { return out_.is_open(); }
  void write(const nlohmann::json& record) {
    if (!enabled()) return;
    out_ << record.dump() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

}  // namespace tandem::app
