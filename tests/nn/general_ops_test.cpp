// Behaviour of the general op set beyond its values (those are in pytorch_general_ops_test.cpp and
// gradcheck_ops_test.cpp): dropout in training and eval and its seeding, views sharing storage,
// comparisons' mask dtype, and one clear error for each kind of bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "core/random.h"
#include "nn/functional.h"

using namespace tandem;

namespace {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(call, text) EXPECT_NE(error_of([&] { call; }).find(text), std::string::npos) << error_of([&] { call; })

}  // namespace

TEST(GeneralOps, DropoutTrainEvalAndSeeding) {
  const Tensor x = Tensor::ones({64, 64});
  EXPECT_TRUE(F::dropout(x, 0.5, /*training=*/false).is_same(x));  // eval: the identity
  EXPECT_TRUE(F::dropout(x, 0.0, true).is_same(x));
  EXPECT_EQ(F::dropout(x, 1.0, true).to_vector<float>(), std::vector<float>(64 * 64, 0.0f));

  manual_seed(11);
  const auto a = F::dropout(x, 0.25, true).to_vector<float>();
  manual_seed(11);
  const auto b = F::dropout(x, 0.25, true).to_vector<float>();
  manual_seed(12);
  const auto c = F::dropout(x, 0.25, true).to_vector<float>();
  EXPECT_EQ(a, b);  // the default generator, reseeded: the same mask
  EXPECT_NE(a, c);
  Generator g1(3), g2(3);
  EXPECT_EQ(F::dropout(x, 0.25, true, g1).to_vector<float>(), F::dropout(x, 0.25, true, g2).to_vector<float>());

  // Kept elements are scaled by 1/(1-p), so the mean is preserved in expectation: 4096 elements,
  // sd of the mean sqrt(p/(1-p)/4096) = 0.009; 5 sd.
  double sum = 0;
  for (float v : a) sum += v;
  EXPECT_NEAR(sum / a.size(), 1.0, 0.045);

  // The gradient is the mask itself.
  Tensor w = Tensor::ones({8, 8}).set_requires_grad(true);
  Generator g3(4);
  const Tensor y = F::dropout(w, 0.5, true, g3);
  F::sum(y).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), y.to_vector<float>());
}

TEST(GeneralOps, ViewsShareStorageAndComparisonsAreUint8) {
  Tensor x = Tensor::zeros({2, 3});
  Tensor v = F::narrow(F::transpose(x, 0, 1), 0, 1, 2);
  EXPECT_EQ(v.storage(), x.storage());
  EXPECT_EQ(F::expand(Tensor::zeros({3, 1}), {2, 3, 4}).strides(), (Shape{0, 1, 0}));
  const Tensor m = F::gt(Tensor::from_vector<float>({1, -1, 2}, {3}), 0.0);
  EXPECT_EQ(m.dtype(), kUInt8);
  EXPECT_EQ(m.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_FALSE(F::eq(Tensor::ones({2}).set_requires_grad(true), 1.0).requires_grad());
}

TEST(GeneralOps, BadInputsGetOneClearError) {
  const Tensor x = Tensor::zeros({2, 3});
  EXPECT_ERROR(F::add(x, Tensor::zeros({2})), "add: shapes [2, 3] and [2] do not broadcast");
  EXPECT_ERROR(F::where(F::gt(x, 0.0), x, Tensor::zeros({4, 1, 1, 2})), "do not broadcast");
  EXPECT_ERROR(F::sum(x, {3}), "sum: dimension 3 out of range for a 2-D tensor");
  EXPECT_ERROR(F::softmax(x, -3), "softmax: dimension -3 out of range");
  EXPECT_ERROR(F::permute(x, {0, 0}), "permute: dimension 0 repeated");
  EXPECT_ERROR(F::transpose(x, 0, 2), "transpose: dimension 2 out of range");
  EXPECT_ERROR(F::narrow(x, 1, 2, 2), "narrow: start 2 + length 2 exceeds dimension 1");
  EXPECT_ERROR(F::expand(x, {2, 4}), "expand: cannot expand");
  EXPECT_ERROR(F::view(F::transpose(x, 0, 1), {6}), "is not contiguous; use reshape()");
  EXPECT_ERROR(F::cat({x, Tensor::zeros({2, 3, 1})}, 0), "cat: tensor 1");
  EXPECT_ERROR(F::split(x, {1, 1}, 1), "split: sizes sum to 2 but dimension 1");
  EXPECT_ERROR(F::chunk(x, 0, 0), "chunk: chunks must be positive");
  EXPECT_ERROR(F::index_select(x, 0, Tensor::from_vector<int64_t>({2}, {1})), "index 2 at position 0 is out of range");
  EXPECT_ERROR(F::gather(x, 1, Tensor::from_vector<int64_t>({0, 3}, {1, 2})), "gather: index 3 at position 1");
  EXPECT_ERROR(F::matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({5, 2})), "matmul: inner dimensions differ");
  EXPECT_ERROR(F::matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 2})), "matmul (batch dimensions)");
  EXPECT_ERROR(F::linear(Tensor::zeros({2, 3, 4}), Tensor::zeros({5, 3}), Tensor()), "linear");
  EXPECT_ERROR(F::gelu(x, "fast"), "gelu: approximate must be \"none\" or \"tanh\"");
  EXPECT_ERROR(F::dropout(x, 1.5, true), "dropout: probability must be in [0, 1]");
  EXPECT_ERROR(F::layer_norm(x, {2}), "layer_norm: normalized_shape [2]");
  EXPECT_ERROR(F::layer_norm(x, {3}, Tensor::ones({2})), "layer_norm: weight and bias must have shape [3]");
  EXPECT_ERROR(F::embedding(Tensor::from_vector<int64_t>({0, 4}, {2}), Tensor::zeros({4, 2})),
               "embedding: index 4 at position 1 is out of range for 4 embeddings");
  EXPECT_ERROR(F::embedding(Tensor::from_vector<int64_t>({0}, {1}), Tensor::zeros({4, 2}), 4),
               "embedding: padding_idx 4 out of range");
  const Tensor logits = Tensor::zeros({3, 4});
  EXPECT_ERROR(F::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1}, {3})),
               "nll_loss (cross_entropy's too): target[1] = 4 is out of range; expected a class index in [0, 4) "
               "or ignore_index -100");
  EXPECT_ERROR(F::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1}, {3}), -100, 0.1),
               "nll_loss (cross_entropy's too): target 4 at position 1 is out of range for 4 classes");
  EXPECT_ERROR(F::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1}, {2})), "does not match input");
  EXPECT_ERROR(F::cross_entropy(logits, Tensor::zeros({3})),
               "class-probability target float32[3] on cpu must have the input's shape and dtype");
  EXPECT_ERROR(F::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, 2}, {3}), -100, 0.0, "avg"),
               "reduction must be \"mean\", \"sum\" or \"none\"");
  EXPECT_ERROR(F::mse_loss(x, Tensor::zeros({3, 2})), "mse_loss");
  EXPECT_ERROR(F::prod(x, -3), "prod: dimension -3 out of range for a 2-D tensor");
  EXPECT_ERROR(F::cumsum(x, 2), "cumsum: dimension 2 out of range");
  EXPECT_ERROR(F::std(x, {1, 1}), "std: dimension 1 appears more than once");
  EXPECT_ERROR(F::cumsum(Tensor::zeros({2}, kInt64), 0), "cumsum");
}

// Empty inputs as PyTorch: sums are 0, means and variances NaN, a zero-size batch flows through linear
// and the losses; max/min/argmax/argmin of nothing is an error naming the empty dimension.
TEST(GeneralOps, EmptyReductionsAndZeroSizeBatches) {
  EXPECT_EQ(F::sum(Tensor::zeros({0})).item<float>(), 0.0f);
  EXPECT_EQ(F::sum(Tensor::zeros({2, 0}), {1}).to_vector<float>(), (std::vector<float>{0, 0}));
  EXPECT_TRUE(std::isnan(F::mean(Tensor::zeros({0})).item<float>()));
  EXPECT_TRUE(std::isnan(F::var(Tensor::zeros({0})).item<float>()));
  EXPECT_TRUE(std::isnan(F::var(Tensor::ones({1})).item<float>()));  // N - correction = 0
  EXPECT_TRUE(std::isnan(F::std(Tensor::zeros({2, 0}), {1}).to_vector<float>()[1]));
  EXPECT_EQ(F::prod(Tensor::zeros({2, 0}), 1).to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(F::prod(Tensor::zeros({0})).item<float>(), 1.0f);
  EXPECT_EQ(shape_str(F::cumsum(Tensor::zeros({2, 0}), 1).shape()), "[2, 0]");
  EXPECT_EQ(F::var(Tensor::ones({1}), {}, 0.0).item<float>(), 0.0f);
  EXPECT_EQ(F::max(Tensor::zeros({0, 3}), 1).values.numel(), 0);  // nothing empty is reduced
  EXPECT_ERROR(F::max(Tensor::zeros({0})), "max: cannot reduce the empty tensor float32[0]");
  EXPECT_ERROR(F::min(Tensor::zeros({0})), "min: cannot reduce the empty tensor");
  EXPECT_ERROR(F::max(Tensor::zeros({2, 0}), 1), "max: cannot reduce the empty dimension 1 of float32[2, 0]");
  EXPECT_ERROR(F::min(Tensor::zeros({2, 0}), -1), "min: cannot reduce the empty dimension 1");
  EXPECT_ERROR(F::amax(Tensor::zeros({2, 0}), {1}), "amax: cannot reduce the empty dimension 1");
  EXPECT_ERROR(F::amin(Tensor::zeros({2, 0})), "amin: cannot reduce the empty dimension 1");
  EXPECT_ERROR(F::argmax(Tensor::zeros({0})), "argmax: cannot reduce the empty tensor");
  EXPECT_ERROR(F::argmin(Tensor::zeros({3, 0}), 1), "argmin: cannot reduce the empty dimension 1");
  EXPECT_ERROR(F::clamp(Tensor::zeros({2}), std::nullopt, std::nullopt), "clamp: expected a min or a max bound");

  Tensor x = Tensor::zeros({0, 3}).set_requires_grad(true);
  Tensor w = Tensor::ones({2, 3}).set_requires_grad(true);
  Tensor y = F::linear(x, w, Tensor::ones({2}));
  EXPECT_EQ(shape_str(y.shape()), "[0, 2]");
  F::sum(y).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(shape_str(x.grad().shape()), "[0, 3]");
  Tensor logits = Tensor::zeros({0, 4}).set_requires_grad(true);
  Tensor loss = F::cross_entropy(logits, Tensor::zeros({0}, kInt64));
  EXPECT_TRUE(std::isnan(loss.item<float>()));  // mean over no targets
  loss.backward();
  EXPECT_EQ(shape_str(logits.grad().shape()), "[0, 4]");
  EXPECT_EQ(F::cross_entropy(logits, Tensor::zeros({0}, kInt64), -100, 0.0, "sum").item<float>(), 0.0f);
  EXPECT_TRUE(std::isnan(F::mse_loss(Tensor::zeros({0}), Tensor::zeros({0})).item<float>()));
}

TEST(GeneralOps, CrossEntropyIgnoresTargetsAndAllIgnoredIsNaN) {
  const Tensor logits = Tensor::from_vector<float>({0, 0, 5, 0, 0, 0}, {2, 3});
  const Tensor t = Tensor::from_vector<int64_t>({-100, 1}, {2});
  EXPECT_NEAR(F::cross_entropy(logits, t).item<float>(), std::log(3.0f), 1e-6);  // only row 1 counts
  EXPECT_TRUE(std::isnan(F::cross_entropy(logits, Tensor::from_vector<int64_t>({-100, -100}, {2})).item<float>()));
  EXPECT_EQ(F::cross_entropy(logits, t, -100, 0.0, "none").to_vector<float>()[0], 0.0f);
}

TEST(GeneralOps, SortAndTopkEdgesAndErrors) {
  // A 0-D tensor sorts as one element; an empty dimension gives empty results.
  const Tensor s = Tensor::from_vector<float>({2.5f}, {});
  const auto sorted = F::sort(s);
  EXPECT_EQ(sorted.values.dim(), 0);
  EXPECT_EQ(sorted.values.item<float>(), 2.5f);
  EXPECT_EQ(sorted.indices.item<int64_t>(), 0);
  EXPECT_EQ(F::topk(Tensor::zeros({3, 0}), 0, 1).values.numel(), 0);
  EXPECT_EQ(shape_str(F::argsort(Tensor::zeros({0, 4}), 0).shape()), "[0, 4]");
  // topk's gradient goes only to the chosen positions.
  Tensor x = Tensor::from_vector<float>({0.5f, 3.0f, -1.0f, 2.0f}, {4});
  x.set_requires_grad(true);
  F::sum(F::topk(x, 2).values).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 1, 0, 1}));

  EXPECT_ERROR(F::topk(Tensor::zeros({2, 5}), 6, 1), "topk: k = 6 is out of range for dimension 1 of size 5 (expected 0 <= k <= 5)");
  EXPECT_ERROR(F::topk(Tensor::zeros({2, 5}), -1), "expected 0 <= k <= 5");
  EXPECT_ERROR(F::topk(s, 0), "a 0-D tensor has one element, so k must be 1");
  EXPECT_ERROR(F::sort(Tensor::zeros({2, 3}), 2), "sort");
  EXPECT_ERROR(F::argsort(Tensor::zeros({2}, kInt64)), "argsort");
}

TEST(GeneralOps, PoolingArgumentsGetOneClearError) {
  const Tensor x = Tensor::zeros({1, 2, 6, 6});
  EXPECT_ERROR(F::max_pool2d(x, 3, 1, 1, 0), "dilation must be >= 1, got (0, 0)");
  EXPECT_ERROR(F::max_pool2d(x, 3, 1, 0, 3), "smaller than the (dilated) kernel 7x7");
  EXPECT_ERROR(F::adaptive_max_pool2d(x, {0, 2}), "adaptive_max_pool2d: output size must be >= 1, got [0, 2]");
  EXPECT_ERROR(F::adaptive_max_pool2d(Tensor::zeros({6, 6}), {2, 2}), "expected [N, C, H, W] or [C, H, W]");
  EXPECT_ERROR(F::avg_pool2d(x, 2, 2, 0, false, true, -3), "divisor_override must be positive (0: none), got -3");
  // adaptive windows cover the plane: an output as large as the input is the input itself
  const Tensor r = Tensor::from_vector<float>({1, 5, 2, 4, 3, 0}, {1, 1, 2, 3});
  EXPECT_EQ(F::adaptive_max_pool2d(r, {2, 3}).to_vector<float>(), r.to_vector<float>());
  EXPECT_EQ(F::adaptive_max_pool2d_with_indices(r, {1, 1}).indices.to_vector<int64_t>(), std::vector<int64_t>{1});
}

TEST(GeneralOps, CrossEntropyWeightAndProbabilityTargetErrors) {
  const Tensor x = Tensor::zeros({3, 4});
  const Tensor t = Tensor::from_vector<int64_t>({0, 3, 1}, {3});
  EXPECT_ERROR(F::cross_entropy(x, t, Tensor::ones({3})), "weight must be [C] = [4] of the input's dtype and device");
  EXPECT_ERROR(F::cross_entropy(x, Tensor::zeros({3, 5})), "class-probability target float32[3, 5] on cpu must have the input's shape");
  EXPECT_ERROR(F::cross_entropy(x, Tensor::zeros({3}, kInt32)), "int64 class indices or class probabilities");
  // Zero weights on every kept target: the mean is 0 / 0 (NaN) with a zero gradient, as every target ignored.
  Tensor logits = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  logits.set_requires_grad(true);
  const Tensor w = Tensor::from_vector<float>({0, 1, 1, 0}, {4});
  const Tensor loss = F::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 3, 0}, {3}), w);
  EXPECT_TRUE(std::isnan(loss.item<float>()));
  loss.backward();
  EXPECT_EQ(logits.grad().to_vector<float>(), std::vector<float>(12, 0.0f));
}
