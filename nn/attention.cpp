// nn/attention.h: scaled dot-product attention as a composition of matmul, mul, where/add, softmax
// and dropout, each of which records its own backward. The masked scores are filled with -inf
// through `where`, so masked positions get exactly zero probability and zero gradient.
// On the CPU, without dropout and with no mask or the causal one, the op runs instead as the fused
// kernel of kernels/attention.h under its own node (FusedAttentionBackward), unless switched off
// with set_fused_attention(false); batch dimensions are broadcast before it by expand + reshape,
// whose own nodes sum the gradients back.
#include "nn/attention.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/autograd.h"
#include "core/error.h"
#include "core/view.h"
#include "kernels/attention.h"
#include "nn/functional.h"

namespace tandem::nn::functional {
namespace {

std::atomic<bool> g_fused_attention{true};

struct FusedAttentionBackward final : Node {
  Tensor q, k, v, out, lse;
  double scale = 1.0;
  bool is_causal = false;
  std::string name() const override { return "FusedAttentionBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    auto r = kernels::attention_backward(g[0], q, k, v, out, lse, scale, is_causal);
    return {needs_input_grad(0) ? r.q : Tensor(), needs_input_grad(1) ? r.k : Tensor(),
            needs_input_grad(2) ? r.v : Tensor()};
  }
};

// x [..., rows, cols] expanded to the batch dimensions `batch` and flattened to [B, rows, cols].
Tensor as_batch3(const Tensor& x, const Shape& batch) {
  Shape full = batch;
  full.insert(full.end(), {x.size(-2), x.size(-1)});
  return reshape(expand(x, full), {shape_numel(batch), x.size(-2), x.size(-1)});
}

Shape batch_of(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 2); }

// The fused kernel with its node; shapes already checked by check_qkv.
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double scale) {
  Shape batch = views::broadcast_shapes(views::broadcast_shapes(batch_of(q), batch_of(k), "scaled_dot_product_attention"),
                                        batch_of(v), "scaled_dot_product_attention");
  const Tensor q3 = as_batch3(q, batch), k3 = as_batch3(k, batch), v3 = as_batch3(v, batch);
  auto r = kernels::attention_forward(q3, k3, v3, scale, is_causal);
  if (autograd::any_requires_grad({q3, k3, v3})) {
    auto n = std::make_shared<FusedAttentionBackward>();
    n->q = q3.detach();
    n->k = k3.detach();
    n->v = v3.detach();
    n->out = r.output.detach();  // detached: the node must not own its own output (a cycle)
    n->lse = r.lse;
    n->scale = scale;
    n->is_causal = is_causal;
    autograd::record(n, {q3, k3, v3}, {&r.output});
  }
  batch.insert(batch.end(), {q.size(-2), v.size(-1)});
  return reshape(r.output, batch);
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor* v, const Tensor& mask, bool is_causal,
               const char* op) {
  TANDEM_CHECK(q.defined() && k.defined() && (!v || v->defined()), op, ": query, key and value must be defined");
  TANDEM_CHECK(q.dim() >= 2 && k.dim() >= 2 && (!v || v->dim() >= 2), op,
               ": query, key and value need at least 2 dimensions ([..., L, E]), got query ", shape_str(q.shape()),
               ", key ", shape_str(k.shape()), v ? ", value " + shape_str(v->shape()) : std::string());
  TANDEM_CHECK(q.dtype() == kFloat32 || q.dtype() == kFloat64, op, ": query must be float32 or float64, got ",
               dtype_name(q.dtype()));
  TANDEM_CHECK(k.dtype() == q.dtype() && (!v || v->dtype() == q.dtype()), op,
               ": query, key and value must share a dtype, got ", dtype_name(q.dtype()), ", ", dtype_name(k.dtype()),
               v ? std::string(", ") + dtype_name(v->dtype()) : std::string());
  TANDEM_CHECK(q.size(-1) == k.size(-1), op, ": query's and key's last dimensions (E) must match, got query ",
               shape_str(q.shape()), " and key ", shape_str(k.shape()));
  TANDEM_CHECK(!v || v->size(-2) == k.size(-2), op,
               ": key and value must have the same sequence length (dimension -2), got key ", shape_str(k.shape()),
               " and value ", shape_str(v->shape()));
  if (!mask.defined()) return;
  TANDEM_CHECK(!is_causal, op, ": pass either attn_mask or is_causal, not both (PyTorch's rule)");
  TANDEM_CHECK(mask.dtype() == kUInt8 || mask.dtype() == q.dtype(), op,
               ": attn_mask must be uint8 (1 = may attend) or query's dtype (added to the scores), got ",
               dtype_name(mask.dtype()));
  const int64_t L = q.size(-2), S = k.size(-2);
  const bool fits = mask.dim() >= 1 && (mask.size(-1) == S || mask.size(-1) == 1) &&
                    (mask.dim() < 2 || mask.size(-2) == L || mask.size(-2) == 1);
  TANDEM_CHECK(fits, op, ": attn_mask ", shape_str(mask.shape()), " does not broadcast to the scores [..., ", L, ", ",
               S, "]");
}

// The scores' factor: `scale` when given (finite), else 1 / sqrt(E).
double score_scale(const Tensor& q, std::optional<double> scale, const char* op) {
  if (!scale) return 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  TANDEM_CHECK(std::isfinite(*scale), op, ": scale must be a finite number, got ", *scale);
  return *scale;
}

// q k^T * scale with the mask applied.
Tensor masked_scores(const Tensor& q, const Tensor& k, const Tensor& mask, bool is_causal, double scale) {
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);
  Tensor m = is_causal ? causal_mask(q.size(-2), k.size(-2), scores.device()) : mask;
  if (!m.defined()) return scores;
  if (m.dtype() == kUInt8) {
    const Tensor ninf = Tensor::full({}, -std::numeric_limits<double>::infinity(), scores.dtype(), scores.device());
    return where(m, scores, ninf);
  }
  return add(scores, m);
}

}  // namespace

void set_fused_attention(bool enabled) { g_fused_attention.store(enabled, std::memory_order_relaxed); }

bool fused_attention_enabled() { return g_fused_attention.load(std::memory_order_relaxed); }

bool fused_attention_path(const Tensor& q, const Tensor& k, const Tensor& attn_mask, double dropout_p) {
  return fused_attention_enabled() && q.device().is_cpu() && !attn_mask.defined() && dropout_p == 0.0 &&
         q.size(-2) > 0 && k.size(-2) > 0;
}

Tensor causal_mask(int64_t L, int64_t S, Device device) {
  TANDEM_CHECK(L >= 0 && S >= 0, "causal_mask: sizes must be non-negative, got ", L, " and ", S);
  // A device's masks are uploaded once per (L, S, device) and shared: an upload on every forward
  // would be host work in every step. A handful of sizes at most are live (the cache is emptied
  // when it grows past kMaxCached).
  constexpr size_t kMaxCached = 16;
  static std::mutex mu;
  static auto* cached = new std::map<std::tuple<int64_t, int64_t, int>, Tensor>();  // leaked: see core/cuda
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  if (device.is_cuda()) {
    lock.lock();
    const auto it = cached->find({L, S, device.index});
    if (it != cached->end()) return it->second;
  }
  Tensor m = Tensor::zeros({L, S}, kUInt8);
  uint8_t* p = m.data<uint8_t>();
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j <= i && j < S; ++j) p[i * S + j] = 1;
  if (device.is_cpu()) return m;
  if (cached->size() >= kMaxCached) cached->clear();
  return cached->emplace(std::make_tuple(L, S, device.index), m.to(device)).first->second;
}

Tensor attention_weights(const Tensor& q, const Tensor& k, const Tensor& attn_mask, bool is_causal) {
  check_qkv(q, k, nullptr, attn_mask, is_causal, "attention_weights");
  return softmax(masked_scores(q, k, attn_mask, is_causal, score_scale(q, std::nullopt, "attention_weights")), -1);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, Generator& gen, std::optional<double> scale) {
  check_qkv(q, k, &v, attn_mask, is_causal, "scaled_dot_product_attention");
  TANDEM_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, "scaled_dot_product_attention: dropout_p must be in [0, 1], got ",
               dropout_p);
  const double s = score_scale(q, scale, "scaled_dot_product_attention");
  if (fused_attention_path(q, k, attn_mask, dropout_p)) return fused_attention(q, k, v, is_causal, s);
  Tensor probs = softmax(masked_scores(q, k, attn_mask, is_causal, s), -1);
  if (dropout_p > 0.0) probs = dropout(probs, dropout_p, /*training=*/true, gen);
  return matmul(probs, v);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, std::optional<double> scale) {
  return scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, default_generator(), scale);
}

}  // namespace tandem::nn::functional
