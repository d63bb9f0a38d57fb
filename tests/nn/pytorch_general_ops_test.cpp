// Parity of the general op set (nn/pointwise.h, reduction.h, shape_ops.h, composite.h, losses.h)
// with PyTorch 1.13: forward outputs and gradients against tests/fixtures/general_ops.safetensors
// (made by tests/fixtures/make_op_fixtures.py; its docstring lists every case).
// Assumes: the references are float64 results rounded to float32, and grad_<input> is
// d sum(y * R) / d input (or d loss / d input for the scalar losses, which store no R).
// Tolerance: |actual - expected| <= 1e-5 + 1e-4 |expected| per element, as tests/nn/
// pytorch_ops_test.cpp and for the same reason (tests/fixtures/README.md): the references are exact
// to half an ulp, every reduction here is at most a few dozen O(1) terms, and PyTorch's own float32
// results use at most 3.4% of this budget (make_op_fixtures.py prints it), while a wrong index,
// broadcast or formula gives errors of order 1e-2..1. Integer results (masks, indices) match exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "core/tensor.h"
#include "nn/functional.h"
#include "nn/pytorch_fixture.h"

namespace {

using namespace tandem;
namespace Fn = tandem::nn::functional;

const tandem::testing::PytorchFixture& fixture() {
  static const tandem::testing::PytorchFixture f("general_ops.safetensors", "make_op_fixtures.py");
  return f;
}

bool has(const std::string& name) { return fixture().has(name); }

Tensor get(const std::string& name) { return fixture().get(name); }

void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  tandem::testing::expect_close_to_pytorch(actual, expected, what);
}

// Leaves for `grads` (requires_grad), plain tensors for `others`; checks y and each gradient.
void check_case(const std::string& c, const std::vector<std::string>& grads, const std::vector<std::string>& others,
                const std::function<Tensor(std::map<std::string, Tensor>&)>& fn) {
  SCOPED_TRACE("case " + c);
  std::map<std::string, Tensor> in;
  for (const auto& g : grads) in[g] = get(c + "." + g).set_requires_grad(true);
  for (const auto& o : others) in[o] = get(c + "." + o);
  Tensor y = fn(in);
  expect_close(y, get(c + ".y"), c + ".y");
  ASSERT_TRUE(y.requires_grad()) << c << ": output does not require grad";
  if (has(c + ".R")) {
    y.backward(get(c + ".R"));
  } else {
    y.backward();
  }
  for (const auto& g : grads) expect_close(in[g].grad(), get(c + ".grad_" + g), c + ".grad_" + g);
}

using In = std::map<std::string, Tensor>;

TEST(PytorchGeneralOps, BroadcastingBinary) {
  check_case("add_bcast", {"a", "b"}, {}, [](In& in) { return Fn::add(in["a"], in["b"]); });
  check_case("sub_bcast", {"a", "b"}, {}, [](In& in) { return Fn::sub(in["a"], in["b"]); });
  check_case("mul_bcast", {"a", "b"}, {}, [](In& in) { return Fn::mul(in["a"], in["b"]); });
  check_case("div_bcast", {"a", "b"}, {}, [](In& in) { return Fn::div(in["a"], in["b"]); });
  check_case("pow_tt", {"a", "b"}, {}, [](In& in) { return Fn::pow(in["a"], in["b"]); });
  check_case("pow_ts", {"a"}, {}, [](In& in) { return Fn::pow(in["a"], 2.5); });
  check_case("pow_st", {"b"}, {}, [](In& in) { return Fn::pow(1.7, in["b"]); });
  check_case("maximum", {"a", "b"}, {}, [](In& in) { return Fn::maximum(in["a"], in["b"]); });
  check_case("minimum", {"a", "b"}, {}, [](In& in) { return Fn::minimum(in["a"], in["b"]); });
  check_case("where", {"a", "b"}, {"cond"}, [](In& in) { return Fn::where(in["cond"], in["a"], in["b"]); });
}

TEST(PytorchGeneralOps, Unary) {
  const std::map<std::string, std::function<Tensor(const Tensor&)>> ops = {
      {"neg", [](const Tensor& x) { return Fn::neg(x); }},
      {"exp", [](const Tensor& x) { return Fn::exp(x); }},
      {"log", [](const Tensor& x) { return Fn::log(x); }},
      {"sqrt", [](const Tensor& x) { return Fn::sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return Fn::rsqrt(x); }},
      {"tanh", [](const Tensor& x) { return Fn::tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return Fn::sigmoid(x); }},
      {"gelu", [](const Tensor& x) { return Fn::gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return Fn::gelu(x, "tanh"); }},
      {"silu", [](const Tensor& x) { return Fn::silu(x); }}};
  for (const auto& op : ops) check_case(op.first, {"x"}, {}, [&](In& in) { return op.second(in["x"]); });
}

TEST(PytorchGeneralOps, ComparisonsReturnUint8MasksEqualToTorchBool) {
  const Tensor a = get("compare.a"), b = get("compare.b");
  const std::map<std::string, Tensor> got = {{"eq", Fn::eq(a, b)}, {"ne", Fn::ne(a, b)}, {"lt", Fn::lt(a, b)},
                                             {"le", Fn::le(a, b)}, {"gt", Fn::gt(a, b)}, {"ge", Fn::ge(a, b)}};
  for (const auto& [name, mask] : got) {
    EXPECT_EQ(mask.dtype(), kUInt8) << name;
    EXPECT_EQ(mask.to_vector<uint8_t>(), get("compare." + name).to_vector<uint8_t>()) << name;
  }
}

TEST(PytorchGeneralOps, Reductions) {
  check_case("sum_dims", {"x"}, {}, [](In& in) { return Fn::sum(in["x"], {0, 2}, true); });
  check_case("sum_last", {"x"}, {}, [](In& in) { return Fn::sum(in["x"], {-1}); });
  check_case("mean_dim", {"x"}, {}, [](In& in) { return Fn::mean(in["x"], {1}); });
  check_case("var_unbiased", {"x"}, {}, [](In& in) { return Fn::var(in["x"], {1, 2}); });
  check_case("var_biased", {"x"}, {}, [](In& in) { return Fn::var(in["x"], {0}, 0.0, true); });
  check_case("amax_ties", {"x"}, {}, [](In& in) { return Fn::amax(in["x"], {1, 2}, true); });
  Tensor indices;
  check_case("max_dim", {"x"}, {}, [&](In& in) {
    auto r = Fn::max(in["x"], 1);
    indices = r.indices;
    return r.values;
  });
  EXPECT_EQ(indices.to_vector<int64_t>(), get("max_dim.indices").to_vector<int64_t>());
  const Tensor am = Fn::argmax(get("argmax.x"), 0, true);
  EXPECT_EQ(shape_str(am.shape()), "[1, 3]");
  EXPECT_EQ(am.to_vector<int64_t>(), get("argmax.indices").to_vector<int64_t>());
  check_case("logsumexp", {"x"}, {}, [](In& in) { return Fn::logsumexp(in["x"], {1}); });
}

TEST(PytorchGeneralOps, ViewsAndCopies) {
  check_case("permute", {"x"}, {}, [](In& in) { return Fn::permute(in["x"], {2, 0, 1}); });
  check_case("slice_step", {"x"}, {}, [](In& in) { return Fn::slice(in["x"], 1, 1, 6, 2); });
  check_case("select", {"x"}, {}, [](In& in) { return Fn::select(in["x"], 1, 2); });
  check_case("expand", {"x"}, {}, [](In& in) { return Fn::expand(in["x"], {2, 3, 4}); });
  check_case("cat", {"a", "b"}, {}, [](In& in) { return Fn::cat({in["a"], in["b"]}, 1); });
  check_case("stack", {"a", "b"}, {}, [](In& in) { return Fn::stack({in["a"], in["b"]}, 1); });
  check_case("chunk", {"x"}, {}, [](In& in) {
    auto parts = Fn::chunk(in["x"], 3, 1);
    EXPECT_EQ(parts.size(), 3u);
    return Fn::cat({parts[2], parts[1], parts[0]}, 1);
  });
  check_case("index_select", {"x"}, {"index"}, [](In& in) { return Fn::index_select(in["x"], 0, in["index"]); });
  check_case("gather", {"x"}, {"index"}, [](In& in) { return Fn::gather(in["x"], 1, in["index"]); });
}

TEST(PytorchGeneralOps, MatmulAndLinear) {
  check_case("matmul_batched", {"a", "b"}, {}, [](In& in) { return Fn::matmul(in["a"], in["b"]); });
  check_case("matmul_vec_batched", {"a", "b"}, {}, [](In& in) { return Fn::matmul(in["a"], in["b"]); });
  check_case("linear_3d", {"x", "w", "b"}, {}, [](In& in) { return Fn::linear(in["x"], in["w"], in["b"]); });
}

TEST(PytorchGeneralOps, SoftmaxAndLosses) {
  check_case("softmax_dim1", {"x"}, {}, [](In& in) { return Fn::softmax(in["x"], 1); });
  check_case("log_softmax_dim0", {"x"}, {}, [](In& in) { return Fn::log_softmax(in["x"], 0); });
  check_case("ce_mean_smooth_ignore", {"x"}, {"target"},
             [](In& in) { return Fn::cross_entropy(in["x"], in["target"], -100, 0.1); });
  check_case("ce_nd_sum", {"x"}, {"target"},
             [](In& in) { return Fn::cross_entropy(in["x"], in["target"], -100, 0.0, "sum"); });
  check_case("ce_none", {"x"}, {"target"},
             [](In& in) { return Fn::cross_entropy(in["x"], in["target"], -100, 0.2, "none"); });
  check_case("mse_mean", {"a", "b"}, {}, [](In& in) { return Fn::mse_loss(in["a"], in["b"]); });
}

// PyTorch's F.nll_loss: ignored targets, class weights, each reduction, [N, C, d] and [C] inputs, and
// every target ignored (NaN mean, zero gradient). Mean without weights is the one-pass kernel; the
// rest is composed (kernels/loss.h).
TEST(PytorchGeneralOps, NllLoss) {
  check_case("nll_mean_ignore", {"x"}, {"target"}, [](In& in) { return Fn::nll_loss(in["x"], in["target"]); });
  check_case("nll_weight_sum", {"x"}, {"target", "w"},
             [](In& in) { return Fn::nll_loss(in["x"], in["target"], in["w"], -100, "sum"); });
  check_case("nll_weight_nd_none", {"x"}, {"target", "w"}, [](In& in) {
    return Fn::nll_loss(in["x"], in["target"], Fn::narrow(in["w"], 0, 0, 4).contiguous(), 1, "none");
  });
  check_case("nll_weight_mean", {"x"}, {"target", "w"},
             [](In& in) { return Fn::nll_loss(in["x"], in["target"], in["w"]); });
  check_case("nll_unbatched", {"x"}, {"target"}, [](In& in) { return Fn::nll_loss(in["x"], in["target"]); });
  check_case("nll_all_ignored_mean", {"x"}, {"target"}, [](In& in) { return Fn::nll_loss(in["x"], in["target"]); });
}

// Class weights (index targets: mean divided by the kept targets' weights) and class-probability
// targets (mean over elements; the target's own gradient too), with smoothing and ignored targets.
TEST(PytorchGeneralOps, CrossEntropyWeightsAndProbabilityTargets) {
  check_case("ce_weight", {"x"}, {"target", "w"},
             [](In& in) { return Fn::cross_entropy(in["x"], in["target"], in["w"]); });
  check_case("ce_weight_smooth_ignore", {"x"}, {"target", "w"},
             [](In& in) { return Fn::cross_entropy(in["x"], in["target"], in["w"], -100, 0.1); });
  check_case("ce_weight_nd_none", {"x"}, {"target", "w"}, [](In& in) {
    return Fn::cross_entropy(in["x"], in["target"], Fn::narrow(in["w"], 0, 0, 4).contiguous(), -100, 0.0, "none");
  });
  check_case("ce_prob", {"x", "target"}, {}, [](In& in) { return Fn::cross_entropy(in["x"], in["target"]); });
  // Without smoothing, cross_entropy is log_softmax then nll_loss (the case below runs that path).
  check_case("ce_weight_nd_none", {"x"}, {"target", "w"}, [](In& in) {
    return Fn::nll_loss(Fn::log_softmax(in["x"], 1), in["target"], Fn::narrow(in["w"], 0, 0, 4).contiguous(), -100,
                        "none");
  });
  check_case("ce_prob_weight_smooth_nd", {"x", "target"}, {"w"}, [](In& in) {
    return Fn::cross_entropy(in["x"], in["target"], Fn::narrow(in["w"], 0, 0, 3).contiguous(), -100, 0.2);
  });
}

// The three places where Tandem departed from PyTorch: relu of NaN, log_softmax of large logits (the
// max must be subtracted before log(sum) is), and cross_entropy with every target ignored (NaN mean,
// zero gradient, not NaN gradients).
TEST(PytorchGeneralOps, NanLargeLogitsAndAllIgnoredTargetsAsPytorch) {
  check_case("relu_nan", {"x"}, {}, [](In& in) { return Fn::relu(in["x"]); });
  check_case("log_softmax_large", {"x"}, {}, [](In& in) { return Fn::log_softmax(in["x"], 1); });
  check_case("ce_large_logits", {"x"}, {"target"}, [](In& in) { return Fn::cross_entropy(in["x"], in["target"]); });
  check_case("ce_all_ignored_mean", {"x"}, {"target"},
             [](In& in) { return Fn::cross_entropy(in["x"], in["target"], -100, 0.1); });
  check_case("ce_all_ignored_sum", {"x"}, {"target"},
             [](In& in) { return Fn::cross_entropy(in["x"], in["target"], -100, 0.0, "sum"); });
  check_case("maximum_nan", {"a", "b"}, {}, [](In& in) { return Fn::maximum(in["a"], in["b"]); });
  check_case("minimum_nan", {"a", "b"}, {}, [](In& in) { return Fn::minimum(in["a"], in["b"]); });
}

TEST(PytorchGeneralOps, LayerNormAndEmbedding) {
  check_case("layer_norm_affine", {"x", "w", "b"}, {},
             [](In& in) { return Fn::layer_norm(in["x"], {3, 4}, in["w"], in["b"]); });
  check_case("layer_norm_plain", {"x"}, {}, [](In& in) { return Fn::layer_norm(in["x"], {4}); });
  check_case("embedding_pad", {"weight"}, {"index"},
             [](In& in) { return Fn::embedding(in["index"], in["weight"], 5); });
  // The padding row gets exactly no gradient.
  Tensor w = get("embedding_pad.weight").set_requires_grad(true);
  Fn::sum(Fn::embedding(get("embedding_pad.index"), w, 5)).backward();
  EXPECT_EQ(Fn::select(w.grad(), 0, 5).to_vector<float>(), std::vector<float>(3, 0.0f));
}

}  // namespace

namespace {

TEST(PytorchGeneralOps, ConvolutionGeometryAndAveragePooling) {
  check_case("conv_groups_dilation", {"x", "w", "b"}, {}, [](In& in) {
    return Fn::conv2d(in["x"], in["w"], in["b"], Fn::Conv2dParams{{2, 1}, {1, 2}, {2, 1}, 2});
  });
  check_case("conv_dilation", {"x", "w"}, {}, [](In& in) {
    return Fn::conv2d(in["x"], in["w"], Tensor(), Fn::Conv2dParams{{1, 1}, {1, 1}, {2, 2}, 1});
  });
  check_case("conv_depthwise", {"x", "w", "b"}, {}, [](In& in) {
    return Fn::conv2d(in["x"], in["w"], in["b"], Fn::Conv2dParams{{2, 2}, {0, 0}, {1, 1}, 3});
  });
  check_case("avg_pool_k2", {"x"}, {}, [](In& in) { return Fn::avg_pool2d(in["x"], 2); });
  check_case("avg_pool_k3s2p1_ceil_nopad", {"x"}, {},
             [](In& in) { return Fn::avg_pool2d(in["x"], 3, 2, 1, /*ceil_mode=*/true, /*count_include_pad=*/false); });
  check_case("avg_pool_k3s2p1", {"x"}, {}, [](In& in) { return Fn::avg_pool2d(in["x"], 3, 2, 1); });
  check_case("adaptive_avg_pool", {"x"}, {}, [](In& in) { return Fn::adaptive_avg_pool2d(in["x"], {3, 4}); });
  check_case("adaptive_avg_pool_unbatched", {"x"}, {},
             [](In& in) { return Fn::adaptive_avg_pool2d(in["x"], {1, 1}); });
}

}  // namespace

namespace {

// NaN, a large mean and empty reductions where PyTorch's rule is easy to miss.
TEST(PytorchGeneralOps, NanLargeMeanAndEmptyReductionsAsPytorch) {
  // torch.max(x): the gradient is shared among the NaNs (or the tied maxima), not NaN everywhere.
  check_case("max_all_nan", {"x"}, {}, [](In& in) { return Fn::max(in["x"]); });
  check_case("max_all_ties", {"x"}, {}, [](In& in) { return Fn::max(in["x"]); });
  // 1e4 + 1e-2 noise: the mean's rounding (~5e-4) must not leak into the variance or its gradient.
  check_case("var_large_mean", {"x"}, {}, [](In& in) { return Fn::var(in["x"], {1}); });
  expect_close(Fn::logsumexp(Tensor::zeros({2, 0}), {1}), get("logsumexp_empty.y"), "logsumexp_empty.y");
  const Tensor a = get("compare_nan.a"), b = get("compare_nan.b");
  const std::map<std::string, Tensor> got = {{"eq", Fn::eq(a, b)}, {"ne", Fn::ne(a, b)}, {"lt", Fn::lt(a, b)},
                                             {"le", Fn::le(a, b)}, {"gt", Fn::gt(a, b)}, {"ge", Fn::ge(a, b)}};
  for (const auto& [name, mask] : got) {
    EXPECT_EQ(mask.to_vector<uint8_t>(), get("compare_nan." + name).to_vector<uint8_t>()) << name;
  }
  check_case("max_pool_nan", {"x"}, {}, [](In& in) { return Fn::max_pool2d(in["x"], 2); });
  check_case("max_pool_nan_k3s2p1", {"x"}, {}, [](In& in) { return Fn::max_pool2d(in["x"], 3, 2, 1); });
}

TEST(PytorchGeneralOps, AbsAndClamp) {
  check_case("abs", {"x"}, {}, [](In& in) { return Fn::abs(in["x"]); });
  check_case("clamp_both", {"x"}, {}, [](In& in) { return Fn::clamp(in["x"], -1.0, 0.5); });
  check_case("clamp_min", {"x"}, {}, [](In& in) { return Fn::clamp(in["x"], -1.0, std::nullopt); });
  check_case("clamp_max", {"x"}, {}, [](In& in) { return Fn::clamp(in["x"], std::nullopt, 0.5); });
  check_case("clamp_inverted", {"x"}, {}, [](In& in) { return Fn::clamp(in["x"], 1.0, -1.0); });
}

TEST(PytorchGeneralOps, MinAminArgmin) {
  Tensor indices;
  check_case("min_dim", {"x"}, {}, [&](In& in) {
    auto r = Fn::min(in["x"], 1);
    indices = r.indices;
    return r.values;
  });
  EXPECT_EQ(indices.to_vector<int64_t>(), get("min_dim.indices").to_vector<int64_t>());
  const Tensor x = get("argmin.x");
  const Tensor am = Fn::argmin(x, 1, true);
  EXPECT_EQ(shape_str(am.shape()), "[3, 1]");
  EXPECT_EQ(am.to_vector<int64_t>(), get("argmin.indices").to_vector<int64_t>());
  EXPECT_EQ(Fn::argmin(x).to_vector<int64_t>(), get("argmin.flat").to_vector<int64_t>());
  check_case("amin_ties", {"x"}, {}, [](In& in) { return Fn::amin(in["x"], {0, 1}, true); });
  check_case("amin_nan", {"x"}, {}, [](In& in) { return Fn::amin(in["x"], {1}); });
  check_case("min_all_nan", {"x"}, {}, [](In& in) { return Fn::min(in["x"]); });
  check_case("min_all_ties", {"x"}, {}, [](In& in) { return Fn::min(in["x"]); });
}

}  // namespace

namespace {

TEST(PytorchGeneralOps, ProdStdCumsum) {
  check_case("prod_dim", {"x"}, {}, [](In& in) { return Fn::prod(in["x"], 1); });
  check_case("prod_zeros", {"x"}, {}, [](In& in) { return Fn::prod(in["x"], 1, true); });
  check_case("prod_all", {"x"}, {}, [](In& in) { return Fn::prod(in["x"]); });
  expect_close(Fn::prod(Tensor::ones({2, 0}), 1), get("prod_empty.y"), "prod_empty.y");
  check_case("std_dims", {"x"}, {}, [](In& in) { return Fn::std(in["x"], {0, 2}); });
  check_case("std_constant_row", {"x"}, {}, [](In& in) { return Fn::std(in["x"], {1}, 0.0, true); });
  check_case("std_large_mean", {"x"}, {}, [](In& in) { return Fn::std(in["x"], {1}); });
  check_case("cumsum_mid", {"x"}, {}, [](In& in) { return Fn::cumsum(in["x"], 1); });
  check_case("cumsum_nan", {"x"}, {}, [](In& in) { return Fn::cumsum(in["x"], -1); });
}

// check_case of `name` through op(x) -> {values, indices}: values and gradients as check_case, the
// int64 positions exactly.
template <typename Op>
void check_with_indices(const std::string& name, Op op) {
  Tensor indices;
  check_case(name, {"x"}, {}, [&](In& in) {
    auto r = op(in["x"]);
    indices = r.indices;
    return r.values;
  });
  EXPECT_EQ(indices.dtype(), kInt64) << name;
  EXPECT_EQ(shape_str(indices.shape()), shape_str(get(name + ".indices").shape())) << name;
  EXPECT_EQ(indices.to_vector<int64_t>(), get(name + ".indices").to_vector<int64_t>()) << name;
}

// max_pool2d's dilation, ceil_mode, unbatched input and return_indices, adaptive_max_pool2d, and
// avg_pool2d's divisor_override, against PyTorch: values and gradients, positions exactly.
TEST(PytorchGeneralOps, MaxPoolGeometryAdaptiveAndDivisorOverride) {
  const auto with_indices = [](const std::string& name, auto op) { check_with_indices(name, op); };
  with_indices("max_pool_dilation", [](const Tensor& x) { return Fn::max_pool2d_with_indices(x, 3, 2, 1, 2); });
  with_indices("max_pool_ceil", [](const Tensor& x) { return Fn::max_pool2d_with_indices(x, 2, 2, 0, 1, true); });
  with_indices("max_pool_unbatched", [](const Tensor& x) { return Fn::max_pool2d_with_indices(x, 3, 1, 1); });
  with_indices("adaptive_max_pool", [](const Tensor& x) { return Fn::adaptive_max_pool2d_with_indices(x, {3, 4}); });
  with_indices("adaptive_max_pool_unbatched",
               [](const Tensor& x) { return Fn::adaptive_max_pool2d_with_indices(x, {2, 3}); });
  check_case("avg_pool_divisor", {"x"}, {}, [](In& in) { return Fn::avg_pool2d(in["x"], 3, 2, 1, false, true, 5); });
}

// sort, argsort, topk: values and their gradients against PyTorch's float64 answer, positions
// exactly (ties under PyTorch's stable=True, the order Tandem always keeps).
TEST(PytorchGeneralOps, SortArgsortTopk) {
  const auto with_indices = [](const std::string& name, auto op) { check_with_indices(name, op); };
  with_indices("sort_desc", [](const Tensor& x) { return Fn::sort(x, 1, true); });
  with_indices("sort_specials", [](const Tensor& x) { return Fn::sort(x, -1); });
  EXPECT_EQ(Fn::argsort(get("sort_specials.x"), -1, true).to_vector<int64_t>(),
            get("sort_specials.desc_indices").to_vector<int64_t>());
  EXPECT_EQ(Fn::argsort(get("argsort_ties.x"), 0).to_vector<int64_t>(),
            get("argsort_ties.indices").to_vector<int64_t>());
  with_indices("topk_largest", [](const Tensor& x) { return Fn::topk(x, 3, -1); });
  with_indices("topk_smallest", [](const Tensor& x) { return Fn::topk(x, 2, 0, false); });
  with_indices("topk_nan", [](const Tensor& x) { return Fn::topk(x, 2, 1); });
}

}  // namespace
