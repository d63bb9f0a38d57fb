// backend_ops on the CPU: every case of every table op (kernels/ops.h) in float32 against the same
// op in float64, and the check that each backend built registers no op without cases. The same
// file runs in each SIMD-level build (native, scripts/ci/isa.sh's AVX2, the portable ASan build);
// tests/gpu/backend_ops_test.cpp runs the same cases on CUDA against the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/backend_ops_cases.h"

using namespace tandem;
using namespace tandem::backend_ops;

namespace {

const CaseTable& cases() {
  static const CaseTable table = backend_op_cases();
  return table;
}

std::vector<std::string> op_names() {
  std::vector<std::string> out;
  for (const char* op : kernels::table_ops()) out.emplace_back(op);
  return out;
}

class BackendOps : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendOps, CpuFloat32AgreesWithFloat64) {
  const auto it = cases().find(GetParam());
  ASSERT_NE(it, cases().end()) << GetParam() << " has no case list (tests/kernels/backend_ops_*_cases.h)";
  expect_cases_agree(it->second, kFloat32, Device::cpu(), kFloat64, Device::cpu(), 1.0);
}

INSTANTIATE_TEST_SUITE_P(EveryTableOp, BackendOps, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(BackendOpsTable, EveryRegisteredOpHasCases) {
  for (const kernels::Backend* backend : kernels::backends()) {
    const std::vector<std::string> missing = ops_without_cases(kernels::registered_ops(*backend), cases());
    EXPECT_TRUE(missing.empty()) << "the " << backend->backend_name << " backend registers "
                                 << ::testing::PrintToString(missing)
                                 << " without cases: add them to tests/kernels/backend_ops_*_cases.h";
  }
}

TEST(BackendOpsTable, EveryCaseListNamesATableOp) {
  const std::vector<std::string> ops = op_names();
  for (const auto& [op, list] : cases()) {
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << "cases for " << op << ", not an op of kernels/ops.h";
  }
}

TEST(BackendOpsTable, TheCpuBackendRegistersEveryOp) {
  EXPECT_EQ(kernels::registered_ops(kernels::cpu_backend()).size(), kernels::table_ops().size());
  EXPECT_STREQ(kernels::cpu_backend().backend_name, "cpu");
}

// A backend other than the CPU's registers every op but the CPU's fast paths (TANDEM_OPS_CPU_ONLY),
// whose entry points refuse its operands.
TEST(BackendOpsTable, OtherBackendsLackOnlyTheCpuOnlyOps) {
  const std::vector<const char*> cpu_only = kernels::cpu_only_ops();
  EXPECT_EQ(cpu_only.size(), 10u);
  for (const kernels::Backend* backend : kernels::backends()) {
    if (backend == &kernels::cpu_backend()) continue;
    std::vector<std::string> missing;
    for (const char* op : kernels::table_ops()) {
      const std::vector<const char*> have = kernels::registered_ops(*backend);
      if (std::find_if(have.begin(), have.end(), [op](const char* h) { return std::string(h) == op; }) == have.end())
        missing.emplace_back(op);
    }
    EXPECT_EQ(missing, std::vector<std::string>(cpu_only.begin(), cpu_only.end())) << backend->backend_name;
  }
}

// The check above names an op whose case list is missing or empty.
TEST(BackendOpsTable, AMissingCaseListIsReported) {
  CaseTable partial = cases();
  partial.erase("cumsum");
  partial["where"].clear();
  EXPECT_EQ(ops_without_cases(kernels::registered_ops(kernels::cpu_backend()), partial),
            (std::vector<std::string>{"where", "cumsum"}));
}

// An op a backend lacks: its entry point throws naming the op and the backend.
TEST(BackendOpsTable, AnOpMissingFromABackendThrows) {
  kernels::Backend partial = kernels::cpu_backend();
  partial.cumsum = nullptr;
  EXPECT_EQ(kernels::registered_ops(partial).size(), kernels::table_ops().size() - 1);
  try {
    kernels::throw_missing_kernel("cumsum", partial);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cumsum: the cpu backend has no kernel"), std::string::npos) << e.what();
  }
}

}  // namespace
