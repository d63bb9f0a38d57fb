// DeviceTimer on the host (the CUDA side: tests/gpu/memory_test.cpp): NaN until a span was
// started and stopped, then the host time between the two calls; CUDA devices in a build without
// CUDA are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "core/device_timer.h"
#include "core/error.h"

namespace tandem {
namespace {

TEST(DeviceTimer, HostSpansAreHostTime) {
  DeviceTimer t(Device::cpu());
  EXPECT_TRUE(std::isnan(t.elapsed_ms()));
  t.start();
  EXPECT_TRUE(std::isnan(t.elapsed_ms())) << "started but not stopped";
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  t.stop();
  EXPECT_GE(t.elapsed_ms(), 2.0);
  t.start();  // a new span
  EXPECT_TRUE(std::isnan(t.elapsed_ms()));
  t.stop();
  EXPECT_GE(t.elapsed_ms(), 0.0);
  EXPECT_LT(t.elapsed_ms(), 2.0);
}

TEST(DeviceTimer, CudaWithoutCudaIsRefusedByName) {
  if (cuda_compiled()) GTEST_SKIP() << "covered by the GPU tests in CUDA builds";
  try {
    DeviceTimer t(Device::cuda(0));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
