// backend_ops on CUDA: every case of every op the CUDA backend registers (kernels/ops.h), run in
// float32 on cuda:0 against the CPU kernels in float32 (the cases of
// tests/kernels/backend_ops_cases.h, which the CPU suite checks against float64). CUDA's math
// library and summation order differ from the CPU's by a few roundings, so each case's tolerance is
// widened 4x. The ops whose CUDA kernels have a float64 path run their cases in float64 too, against
// the CPU's float64. Skips without a device (fails under TANDEM_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <algorithm>
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

// op's case list in `dtype` on cuda:0 against the CPU in `dtype`.
void expect_op_agrees_with_cpu(const std::string& op, DType dtype) {
  ASSERT_NE(kernels::cuda_backend(), nullptr) << "a device is visible but Tandem was built without CUDA";
  static const CaseTable table = backend_op_cases();
  const auto it = table.find(op);
  ASSERT_NE(it, table.end()) << op << " has no case list (tests/kernels/backend_ops_*_cases.h)";
  expect_cases_agree(it->second, dtype, gpu_test::gpu(), dtype, Device::cpu(), 4.0);
}

class BackendOpsCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendOpsCuda, Float32AgreesWithTheCpu) {
  TANDEM_NEED_GPUS(1);
  expect_op_agrees_with_cpu(GetParam(), kFloat32);
}

INSTANTIATE_TEST_SUITE_P(EveryCudaOp, BackendOpsCuda, ::testing::ValuesIn(cuda_ops()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The ops whose CUDA kernels take float64 (kernels/cuda/*.cu: check_f32_f64_cuda, and cuBLAS's
// dgemm for linear and cuDNN's double convolutions for conv2d: check_float_cuda).
std::vector<std::string> cuda_float64_ops() {
  return {"add", "sub", "mul", "scale", "sum", "argmax", "log_softmax_forward", "log_softmax_backward", "binary",
          "binary_backward", "compare", "where", "unary", "unary_backward", "sum_dims", "max_dim", "amax",
          "softmax_forward", "softmax_backward", "index_select", "index_add", "gather", "scatter_add", "bmm",
          "linear_forward", "linear_backward", "matmul", "nll_loss_mean_forward", "nll_loss_mean_backward",
          "layer_norm_forward", "layer_norm_backward", "relu_forward", "relu_backward", "conv2d_forward",
          "conv2d_backward", "max_pool2d_forward", "max_pool2d_backward", "avg_pool_forward", "avg_pool_backward",
          "prod_dim", "prod_dim_backward", "cumsum", "argsort"};
}

class BackendOpsCudaFloat64 : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendOpsCudaFloat64, Float64AgreesWithTheCpu) {
  TANDEM_NEED_GPUS(1);
  expect_op_agrees_with_cpu(GetParam(), kFloat64);
}

INSTANTIATE_TEST_SUITE_P(Float64CudaOps, BackendOpsCudaFloat64, ::testing::ValuesIn(cuda_float64_ops()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Every name above is an op the table has (a renamed op would otherwise drop out unnoticed).
TEST(BackendOpsCudaFloat64List, NamesTableOps) {
  const std::vector<const char*> ops = kernels::table_ops();
  for (const std::string& name : cuda_float64_ops()) {
    EXPECT_TRUE(std::find_if(ops.begin(), ops.end(), [&](const char* op) { return name == op; }) != ops.end())
        << name;
  }
}

}  // namespace
