// Test helper for the models library's e2e tests: tandem-train and tandem-test on the configs in
// configs/, with 2 ranks under tandem-run on a free port, and reading their printed metrics.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/test_util.h"

namespace tandem::test {

inline const std::string kTrain = TANDEM_BINARY_DIR "/apps/tandem-train";
inline const std::string kTest = TANDEM_BINARY_DIR "/apps/tandem-test";
inline const std::string kConfigs = TANDEM_SOURCE_DIR "/configs";

// The number after the last (first) `key` in `text` (NaN when absent).
inline double last_value(const std::string& text, const std::string& key) {
  const size_t at = text.rfind(key);
  return at == std::string::npos ? std::nan("") : std::stod(text.substr(at + key.size()));
}
inline double first_value(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  return at == std::string::npos ? std::nan("") : std::stod(text.substr(at + key.size()));
}

// tandem-test's output: its last line, the metrics.
inline std::string test_metrics(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  EXPECT_EQ(run_process(argv, log), 0) << read_file(log);
  std::string out = read_file(log);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out.substr(out.rfind('\n') + 1);
}

// `tandem-run --nproc-per-node 2 tandem-train CONFIG --launcher pytorch ARGS...` on a free port
// (another when it was taken in between); returns the exit status.
inline int train_two_ranks(const std::string& config, const std::vector<std::string>& args,
                           const std::filesystem::path& log) {
  int rc = -1;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<std::string> argv = {kRun, "--nproc-per-node", "2", "--master-port", std::to_string(free_port()),
                                     kTrain, config, "--launcher", "pytorch"};
    argv.insert(argv.end(), args.begin(), args.end());
    rc = run_process(argv, log);
    if (rc == 0 || read_file(log).find("already in use") == std::string::npos) break;
  }
  return rc;
}

}  // namespace tandem::test
