// core/profiler: exact call and FLOP counts for known conv/linear shapes,
// forward vs backward attribution through the autograd engine, nothing
// recorded while disabled, sections (training / evaluation) kept apart, and the report's rows.
#include "core/profiler.h"

#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "kernels/conv.h"
#include "kernels/pointwise.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/linear.h"
#include "nn/functional.h"

namespace tandem {
namespace {

const profiler::OpStat* find(const std::vector<profiler::OpStat>& stats, const std::string& op, bool bwd) {
  for (const auto& s : stats)
    if (s.op == op && s.backward == bwd) return &s;
  return nullptr;
}

class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    profiler::reset();
    profiler::set_enabled(true);
  }
  void TearDown() override {
    profiler::set_enabled(false);
    profiler::reset();
  }
};

TEST_F(ProfilerTest, CountsConvCallsAndFlopsExactly) {
  // x [2, 3, 8, 8], w [4, 3, 3, 3], stride 1, pad 1 -> y [2, 4, 8, 8].
  const Tensor x = Tensor::full({2, 3, 8, 8}, 0.5), w = Tensor::full({4, 3, 3, 3}, 0.1);
  const Tensor b = Tensor::zeros({4});
  kernels::Conv2dArgs args;
  args.pad_h = args.pad_w = 1;
  kernels::conv2d_forward(x, w, b, args);
  kernels::conv2d_forward(x, w, b, args);
  const Tensor gy = Tensor::ones({2, 4, 8, 8});
  kernels::conv2d_backward(gy, x, w, args, /*need_input=*/true, /*need_weight=*/true, /*need_bias=*/true);

  const auto stats = profiler::snapshot();
  const double one_gemm = 2.0 * (2 * 8 * 8) * (4 * 3 * 3 * 3);  // 2 * N*P*Q * K*C*R*S = 55296
  const auto* fwd = find(stats, "conv2d_forward", false);
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->calls, 2);
  EXPECT_DOUBLE_EQ(fwd->flops, 2 * one_gemm);
  EXPECT_GT(fwd->seconds, 0.0);
  // Called outside a backward: counted as forward-phase, with two GEMMs.
  const auto* bwd_kernel = find(stats, "conv2d_backward", false);
  ASSERT_NE(bwd_kernel, nullptr);
  EXPECT_EQ(bwd_kernel->calls, 1);
  EXPECT_DOUBLE_EQ(bwd_kernel->flops, 2 * one_gemm);
}

TEST_F(ProfilerTest, CountsLinearAndMatmulFlopsExactly) {
  const Tensor x = Tensor::full({5, 7}, 1.0), w = Tensor::full({3, 7}, 0.5), b = Tensor::zeros({3});
  kernels::linear_forward(x, w, b);
  {
    const profiler::BackwardPhase phase;
    kernels::linear_backward(Tensor::ones({5, 3}), x, w, /*need_input=*/false, /*need_weight=*/true,
                             /*need_bias=*/true);
  }
  kernels::matmul(Tensor::ones({4, 6}), Tensor::ones({6, 2}));
  const auto stats = profiler::snapshot();
  const auto* fwd = find(stats, "linear_forward", false);
  const auto* bwd = find(stats, "linear_backward", true);
  const auto* mm = find(stats, "matmul", false);
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(fwd->calls, 1);
  EXPECT_DOUBLE_EQ(fwd->flops, 2.0 * 5 * 7 * 3);
  EXPECT_EQ(bwd->calls, 1);
  EXPECT_DOUBLE_EQ(bwd->flops, 2.0 * 5 * 7 * 3);  // weight gradient only
  EXPECT_EQ(find(stats, "linear_backward", false), nullptr);
  EXPECT_DOUBLE_EQ(mm->flops, 2.0 * 4 * 6 * 2);
  EXPECT_FALSE(profiler::in_backward_phase());
}

TEST_F(ProfilerTest, AutogradBackwardIsAttributedToTheBackwardPhase) {
  Tensor x = Tensor::full({4, 6}, 0.25);
  Tensor w = Tensor::full({2, 6}, 0.5);
  w.set_requires_grad(true);
  Tensor y = nn::functional::sum(nn::functional::relu(nn::functional::linear(x, w, Tensor())));
  y.backward();
  const auto stats = profiler::snapshot();
  const auto* fwd = find(stats, "linear_forward", false);
  const auto* bwd = find(stats, "linear_backward", true);
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(fwd->calls, 1);
  EXPECT_EQ(bwd->calls, 1);
  EXPECT_DOUBLE_EQ(bwd->flops, 2.0 * 4 * 6 * 2);  // x needs no gradient: one GEMM
  ASSERT_NE(find(stats, "relu_forward", false), nullptr);
  ASSERT_NE(find(stats, "relu_backward", true), nullptr);
  EXPECT_EQ(find(stats, "relu_backward", true)->flops, 0.0);
  EXPECT_FALSE(profiler::in_backward_phase());

  const std::string table = profiler::report(100.0);
  EXPECT_NE(table.find("linear_backward"), std::string::npos) << table;
  EXPECT_NE(table.find("bwd"), std::string::npos) << table;
  EXPECT_NE(table.find("GEMM peak 100.0"), std::string::npos) << table;
}

TEST_F(ProfilerTest, DisabledRecordsNothing) {
  profiler::set_enabled(false);
  EXPECT_FALSE(profiler::enabled());
  const Tensor x = Tensor::full({5, 7}, 1.0), w = Tensor::full({3, 7}, 0.5);
  kernels::linear_forward(x, w, Tensor());
  kernels::binary(kernels::BinaryOp::Add, x, x);
  EXPECT_TRUE(profiler::snapshot().empty());
  profiler::set_enabled(true);
  kernels::linear_forward(x, w, Tensor());
  EXPECT_EQ(profiler::snapshot().size(), 1u);
  profiler::reset();
  EXPECT_TRUE(profiler::snapshot().empty());
}

TEST_F(ProfilerTest, SectionsKeepTheirOpsApartAndEachTableHasItsOwnTotal) {
  const Tensor x = Tensor::full({5, 7}, 1.0), w = Tensor::full({3, 7}, 0.5);
  {
    profiler::Section train("training");
    kernels::linear_forward(x, w, Tensor());
    kernels::linear_forward(x, w, Tensor());
    {
      profiler::Section eval("evaluation");
      kernels::linear_forward(x, w, Tensor());
    }
    kernels::binary(kernels::BinaryOp::Add, x, x);  // back in "training" once the inner section ends
  }
  const auto stats = profiler::snapshot();
  int64_t train_linear = 0, eval_linear = 0, train_add = 0, other = 0;
  for (const auto& s : stats) {
    if (s.section == "training" && s.op == "linear_forward") train_linear += s.calls;
    else if (s.section == "evaluation" && s.op == "linear_forward") eval_linear += s.calls;
    else if (s.section == "training") train_add += s.calls;
    else other += s.calls;
  }
  EXPECT_EQ(train_linear, 2);
  EXPECT_EQ(eval_linear, 1);
  EXPECT_GE(train_add, 1);
  EXPECT_EQ(other, 0);
  const std::string table = profiler::report(0.0);
  const size_t t = table.find("training:\n"), e = table.find("evaluation:\n");
  ASSERT_NE(t, std::string::npos) << table;
  ASSERT_NE(e, std::string::npos) << table;
  EXPECT_LT(t, e) << "sections are reported in the order first recorded:\n" << table;
  // Each section ends with its own total line, so there are two; the evaluation table's only op
  // is linear_forward, at 100% of its total.
  EXPECT_NE(table.find("total", t), table.rfind("total")) << table;
  const std::string eval_part = table.substr(e);
  EXPECT_EQ(eval_part.find("add"), std::string::npos) << eval_part;
  EXPECT_NE(eval_part.find("100.0%"), std::string::npos) << eval_part;
}

TEST_F(ProfilerTest, OneSectionOrNoneReportsOneTableWithoutAHeading) {
  const Tensor x = Tensor::full({5, 7}, 1.0), w = Tensor::full({3, 7}, 0.5);
  kernels::linear_forward(x, w, Tensor());
  const std::string table = profiler::report(0.0);
  EXPECT_EQ(table.find(":\n"), std::string::npos) << table;
  EXPECT_EQ(table.find("total"), table.rfind("total")) << table;
}

TEST_F(ProfilerTest, GemmPeakIsPositiveAndRestoresThreads) {
  const int before = num_threads();
  const double peak = kernels::measure_gemm_peak_gflops(1);
  EXPECT_GT(peak, 0.1);
  EXPECT_EQ(num_threads(), before);
  // bf16: a peak where this CPU has a native low-precision GEMM, else 0 (its lowp ops widen to f32).
  const double lowp = kernels::measure_lowp_gemm_peak_gflops(2);
  if (kernels::cpu::lowp_linear_native(Tensor::full({4, 4}, 1.0).to(kBFloat16))) {
    EXPECT_GT(lowp, 0.1);
  } else {
    EXPECT_EQ(lowp, 0.0);
  }
  EXPECT_EQ(num_threads(), before);
  EXPECT_TRUE(profiler::snapshot().empty());  // neither measurement is recorded
}

// The % of peak column: an f32 op against the f32 GEMM peak, a lowp_* op against the bf16 one, and no %
// for a lowp_* op when no bf16 peak is given (it is not an f32 GEMM's share).
TEST_F(ProfilerTest, LowPrecisionOpsAreShownAgainstTheLowPrecisionPeak) {
  profiler::detail::record("linear_forward", 1e-3, 1e8);       // 100 GFLOP/s
  profiler::detail::record("lowp_linear_forward", 1e-3, 2e8);  // 200 GFLOP/s
  auto row = [](const std::string& table, const std::string& op) {
    const size_t at = table.find("\n" + op + " ");  // a row starts with its op's name
    return at == std::string::npos ? std::string() : table.substr(at + 1, table.find('\n', at + 1) - at - 1);
  };
  const std::string both = profiler::report(100.0, 400.0);
  EXPECT_NE(row(both, "linear_forward").find(" 100.0"), std::string::npos) << both;
  EXPECT_NE(row(both, "lowp_linear_forward").find("200.0    50.0"), std::string::npos) << both;
  EXPECT_NE(both.find("bf16 GEMM peak 400.0"), std::string::npos) << both;
  const std::string f32 = profiler::report(100.0);
  const std::string lowp_row = row(f32, "lowp_linear_forward");
  ASSERT_FALSE(lowp_row.empty()) << f32;
  EXPECT_EQ(lowp_row.back(), '-') << f32;
  EXPECT_EQ(f32.find("bf16 GEMM peak"), std::string::npos) << f32;
}

}  // namespace
}  // namespace tandem
