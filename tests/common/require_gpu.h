// The one gate of every GPU test. TANDEM_NEED_GPUS(n) skips the test, saying why, when fewer than n
// CUDA devices are visible; with TANDEM_REQUIRE_GPU=1 in the environment it fails instead, so a
// machine whose driver is broken or too old for the toolkit (which reads as "0 devices") can never
// pass the GPU suite by skipping it. The reason names the CUDA runtime's error when there is one
// (tandem::cuda_unavailable_reason), e.g. cudaErrorInsufficientDriver.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/device.h"

namespace tandem::test {

inline bool gpu_required() {
  const char* v = std::getenv("TANDEM_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// "" when at least n devices are visible, else why not.
inline std::string missing_gpus(int n) {
  const int count = cuda_device_count();
  if (count >= n) return "";
  std::string why = "needs " + std::to_string(n) + " CUDA device(s), " + std::to_string(count) + " visible";
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) why += " (" + reason + ")";
  return why;
}

}  // namespace tandem::test

#define TANDEM_NEED_GPUS(n)                                                                    \
  do {                                                                                         \
    const std::string tandem_missing_ = ::tandem::test::missing_gpus(n);                       \
    if (!tandem_missing_.empty()) {                                                            \
      if (::tandem::test::gpu_required())                                                      \
        FAIL() << "TANDEM_REQUIRE_GPU=1 but this test " << tandem_missing_;                    \
      GTEST_SKIP() << tandem_missing_;                                                         \
    }                                                                                          \
  } while (0)
