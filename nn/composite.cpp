// nn/composite.h. matmul's 2-D case and bmm, softmax, layer_norm (kernels/layer_norm.h) and
// embedding record their own nodes; the other cases of matmul and dropout are compositions of
// differentiable ops (their gradients follow from those).
#include "nn/composite.h"

#include "core/autograd.h"
#include "core/view.h"
#include "kernels/index.h"
#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"
#include "nn/functional.h"

namespace tandem::nn::functional {
namespace {

struct MatmulBackward final : Node {
  Tensor a, b;
  std::string name() const override { return "MatmulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = kernels::matmul(g[0], b.transpose(0, 1));
    if (needs_input_grad(1)) gb = kernels::matmul(a.transpose(0, 1), g[0]);
    return {ga, gb};
  }
};

struct BmmBackward final : Node {
  Tensor a, b;
  std::string name() const override { return "BmmBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = kernels::bmm(g[0], views::permute(b, {0, 2, 1}));
    if (needs_input_grad(1)) gb = kernels::bmm(views::permute(a, {0, 2, 1}), g[0]);
    return {ga, gb};
  }
};

struct SoftmaxBackward final : Node {
  Tensor y;
  int64_t dim = 0;
  std::string name() const override { return "SoftmaxBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    return {kernels::softmax_backward(g[0], y, dim, /*log=*/false)};
  }
};

struct LayerNormBackward final : Node {
  Tensor x, w, mean, rstd;
  std::string name() const override { return "LayerNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::layer_norm_backward(g[0], x, mean, rstd, w, needs_input_grad(0), needs_input_grad(1),
                                          needs_input_grad(2));
    return {r.input, r.weight, r.bias};
  }
};

struct EmbeddingBackward final : Node {
  Shape weight_shape;
  Tensor flat_indices;
  int64_t padding_idx = kernels::kNoSkip;
  std::string name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor rows = g[0].reshape({flat_indices.numel(), weight_shape[1]});
    return {kernels::index_add(weight_shape, 0, flat_indices, rows, padding_idx)};
  }
};

Tensor matmul_2d(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::matmul(a, b);
  if (autograd::any_requires_grad({a, b})) {
    auto n = std::make_shared<MatmulBackward>();
    n->a = a.detach();
    n->b = b.detach();
    autograd::record(n, {a, b}, {&y});
  }
  return y;
}

}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::bmm(a, b);
  if (autograd::any_requires_grad({a, b})) {
    auto n = std::make_shared<BmmBackward>();
    n->a = a.detach();
    n->b = b.detach();
    autograd::record(n, {a, b}, {&y});
  }
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.defined() && b.defined(), "matmul: operands must be defined");
  TANDEM_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands must be at least 1-D, got ", a.str(), " and ",
               b.str());
  const int64_t ka = a.shape().back(), kb = b.dim() == 1 ? b.shape()[0] : b.shape()[b.dim() - 2];
  TANDEM_CHECK(ka == kb, "matmul: inner dimensions differ: ", a.str(), " x ", b.str(), " (", ka, " vs ", kb, ")");
  if (a.dim() == 1 && b.dim() == 1) return sum(mul(a, b));
  if (a.dim() == 2 && b.dim() == 2) return matmul_2d(a, b);
  if (a.dim() == 1) return squeeze(matmul(unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return squeeze(matmul(a, unsqueeze(b, -1)), -1);
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch = views::broadcast_shapes(batch_a, batch_b, "matmul (batch dimensions)");
  const int64_t M = a.shape()[a.dim() - 2], K = ka, N = b.shape().back();
  const int64_t B = shape_numel(batch);
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  const Tensor a3 = reshape(expand(a, sa), {B, M, K});
  const Tensor b3 = reshape(expand(b, sb), {B, K, N});
  batch.insert(batch.end(), {M, N});
  return reshape(bmm(a3, b3), batch);
}

Tensor softmax(const Tensor& x, int64_t dim) {
  TANDEM_CHECK(x.defined(), "softmax: operand is undefined");
  Tensor y = kernels::softmax_forward(x, dim, /*log=*/false);
  if (autograd::any_requires_grad({x})) {
    auto n = std::make_shared<SoftmaxBackward>();
    n->y = y.detach();
    n->dim = views::wrap_dim(dim, x.dim(), "softmax");
    autograd::record(n, {x}, {&y});
  }
  return y;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  TANDEM_CHECK(x.defined(), "dropout: input is undefined");
  TANDEM_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  if (p == 1.0) return mul(x, 0.0);  // every element dropped (PyTorch returns zeros)
  return mul(x, kernels::dropout_mask(x.shape(), p, x.dtype(), x.device(), gen));
}

Tensor dropout(const Tensor& x, double p, bool training) { return dropout(x, p, training, default_generator()); }

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, const Tensor& bias_in,
                  double eps) {
  TANDEM_CHECK(x_in.defined(), "layer_norm: input is undefined");
  const Tensor x = float32_if_half(x_in), weight = float32_if_half(weight_in), bias = float32_if_half(bias_in);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  TANDEM_CHECK(k >= 1 && k <= x.dim() &&
                   Shape(x.shape().end() - k, x.shape().end()) == normalized_shape,
               "layer_norm: normalized_shape ", shape_str(normalized_shape),
               " must be non-empty and match the trailing dimensions of the input ", x.str());
  for (const Tensor* p : {&weight, &bias}) {
    TANDEM_CHECK(!p->defined() || p->shape() == normalized_shape, "layer_norm: weight and bias must have shape ",
                 shape_str(normalized_shape), ", got ", p->str());
  }
  auto r = kernels::layer_norm_forward(x, shape_numel(normalized_shape), weight, bias, eps);
  if (autograd::any_requires_grad({x, weight, bias})) {
    auto n = std::make_shared<LayerNormBackward>();
    n->x = x.detach();
    n->w = weight.defined() ? weight.detach() : Tensor();
    n->mean = r.mean;
    n->rstd = r.rstd;
    autograd::record(n, {x, weight, bias}, {&r.output});
  }
  return r.output;
}

Tensor embedding(const Tensor& indices, const Tensor& weight_in, std::optional<int64_t> padding_idx) {
  TANDEM_CHECK(weight_in.defined() && weight_in.dim() == 2, "embedding: weight must be 2-D [num_embeddings, dim], got ",
               weight_in.str());
  const Tensor weight = float32_if_half(weight_in);
  TANDEM_CHECK(indices.defined() && (indices.dtype() == kInt64 || indices.dtype() == kInt32),
               "embedding: indices must be int64 (or int32), got ", indices.str());
  const int64_t rows = weight.shape()[0];
  int64_t pad = kernels::kNoSkip;
  if (padding_idx) {
    TANDEM_CHECK(*padding_idx >= -rows && *padding_idx < rows, "embedding: padding_idx ", *padding_idx,
                 " out of range for ", rows, " embeddings");
    pad = *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
  }
  const Tensor flat = indices.to(kInt64).reshape({indices.numel()});
  // A host index is checked here; a CUDA one by index_select's kernel (a deferred kernel error, so
  // the host never waits for the device here).
  if (flat.device().is_cpu()) {
    const int64_t* p = flat.data<int64_t>();  // reshape made it contiguous
    for (int64_t i = 0; i < flat.numel(); ++i) {
      TANDEM_CHECK(p[i] >= 0 && p[i] < rows, "embedding: index ", p[i], " at position ", i,
                   " is out of range for ", rows, " embeddings (expected 0 <= index < ", rows, ")");
    }
  }
  Shape shape = indices.shape();
  shape.push_back(weight.shape()[1]);
  Tensor y = kernels::index_select(weight, 0, flat).reshape(shape);
  if (autograd::any_requires_grad({weight})) {
    auto n = std::make_shared<EmbeddingBackward>();
    n->weight_shape = weight.shape();
    n->flat_indices = flat;
    n->padding_idx = pad;
    autograd::record(n, {weight}, {&y});
  }
  return y;
}

}  // namespace tandem::nn::functional
