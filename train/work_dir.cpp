// Work dir helpers (see work_dir.h).
#include "train/work_dir.h"

#include <ctime>
#include <filesystem>

#include "core/error.h"
#include "train/config.h"

namespace tandem::train {
namespace fs = std::filesystem;

std::string default_work_dir(const std::string& config_file, const std::string& fallback) {
  return (fs::path("work_dirs") / (config_file.empty() ? fallback : config_name(config_file))).string();
}

void create_work_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TANDEM_CHECK(!ec, "cannot create work dir '", dir, "': ", ec.message());
  TANDEM_CHECK(fs::is_directory(dir), "work dir '", dir, "' exists but is not a directory");
}

std::string run_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d_%H%M%S", &tm);
  return buf;
}

}  // namespace tandem::train
