// TANDEM_REQUIRE_GPU=1 turns every GPU test that would skip into a failure that says why, so a
// machine whose GPU is missing, hidden or unusable (a driver older than the toolkit reads as "0
// devices") cannot pass the GPU suite by skipping it. Run on the real GPU test binary with every
// device hidden (CUDA_VISIBLE_DEVICES=-1), so this holds on machines with and without GPUs.
#include <gtest/gtest.h>

#include <string>

#include "common/process.h"
#include "common/test_util.h"

namespace tandem::test {
namespace {

const std::string kGpuTests = TANDEM_BINARY_DIR "/tests/tandem_gpu_tests";

TEST(RequireGpu, GpuTestsFailNamingTheReasonInsteadOfSkipping) {
  ASSERT_TRUE(std::filesystem::exists(kGpuTests)) << kGpuTests << " is not built";
  TempDir dir("require-gpu");
  const std::string filter = "--gtest_filter=CudaKernelProperties.*:NcclGroup.OneGpuCollectives";

  const auto skipped = dir.path() / "plain.log";
  EXPECT_EQ(run_process({"/usr/bin/env", "-u", "TANDEM_REQUIRE_GPU", "CUDA_VISIBLE_DEVICES=-1", kGpuTests, filter},
                        skipped),
            0)
      << read_file(skipped);
  EXPECT_NE(read_file(skipped).find("SKIPPED"), std::string::npos) << read_file(skipped);

  const auto required = dir.path() / "required.log";
  EXPECT_NE(run_process({"/usr/bin/env", "TANDEM_REQUIRE_GPU=1", "CUDA_VISIBLE_DEVICES=-1", kGpuTests, filter},
                        required),
            0)
      << read_file(required);
  const std::string log = read_file(required);
  EXPECT_NE(log.find("TANDEM_REQUIRE_GPU=1 but this test needs 1 CUDA device(s), 0 visible ("), std::string::npos)
      << log;
  // The reason names the runtime's error (or the build without CUDA), not just "no GPU".
  EXPECT_TRUE(log.find("cudaError") != std::string::npos || log.find("built without CUDA") != std::string::npos)
      << log;
  EXPECT_EQ(log.find("SKIPPED"), std::string::npos) << log;
}

}  // namespace
}  // namespace tandem::test
