// backend_ops on CUDA: every case of every op the CUDA backend registers (kernels/ops.h), run in
// float32 on cuda:0 against the CPU kernels in float32 (the cases of
// tests/kernels/backend_ops_cases.h, which the CPU suite checks against float64). CUDA's math
// library and summation order differ from the CPU's by a few roundings, so each case's tolerance is
// widened 4x. Skips without a device (fails under TANDEM_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/backend_ops_cases.h"

using namespace tandem;
using namespace tandem::backend_ops;

namespace {

std::vector<std::string> cuda_ops() {
  std::vector<std::string> out;
  if (const kernels::Backend* cuda = kernels::cuda_backend()) {
    for (const char* op : kernels::registered_ops(*cuda)) out.emplace_back(op);
  }
  if (out.empty()) out.emplace_back("none");  // a CPU-only build: one test that skips
  return out;
}

class BackendOpsCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendOpsCuda, Float32AgreesWithTheCpu) {
  TANDEM_NEED_GPUS(1);
  ASSERT_NE(kernels::cuda_backend(), nullptr) << "a device is visible but Tandem was built without CUDA";
  static const CaseTable table = backend_op_cases();
  const auto it = table.find(GetParam());
  ASSERT_NE(it, table.end()) << GetParam() << " has no case list (tests/kernels/backend_ops_*_cases.h)";
  expect_cases_agree(it->second, kFloat32, gpu_test::gpu(), kFloat32, Device::cpu(), 4.0);
}

INSTANTIATE_TEST_SUITE_P(EveryCudaOp, BackendOpsCuda, ::testing::ValuesIn(cuda_ops()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
