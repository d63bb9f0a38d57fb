// nn/attention_layer.h. The projections are narrow views of in_proj_weight/in_proj_bias (so their
// gradients land in the packed parameters, as PyTorch's), heads are split by reshape + permute,
// and every mask is turned into one additive float mask broadcast to [N, H, L, S].
#include "nn/attention_layer.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "nn/attention.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace tandem::nn {
namespace {

// 1 -> -inf, 0 -> 0 for a uint8 mask; a float mask as it is (its dtype checked).
Tensor additive(const Tensor& mask, DType dtype, const char* what) {
  if (mask.dtype() == kUInt8) {
    const Tensor ninf = Tensor::full({}, -std::numeric_limits<double>::infinity(), dtype, mask.device());
    return F::where(mask, ninf, Tensor::zeros({}, dtype, mask.device()));
  }
  TANDEM_CHECK(mask.dtype() == dtype, "MultiheadAttention: ", what, " must be uint8 (1 = masked) or ",
               dtype_name(dtype), " (added to the scores), got ", dtype_name(mask.dtype()));
  return mask;
}

}  // namespace

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double p, bool bias, bool bf)
    : embed_dim(e), num_heads(h), head_dim(h > 0 ? e / h : 0), dropout(p), batch_first(bf) {
  TANDEM_CHECK(e > 0 && h > 0, "MultiheadAttention: embed_dim and num_heads must be positive, got ", e, " and ", h);
  TANDEM_CHECK(e % h == 0, "MultiheadAttention: embed_dim (", e, ") must be divisible by num_heads (", h, ")");
  TANDEM_CHECK(p >= 0.0 && p <= 1.0, "MultiheadAttention: dropout must be in [0, 1], got ", p);
  in_proj_weight = Tensor::empty({3 * e, e});
  const double bound = std::sqrt(6.0 / static_cast<double>(e + 3 * e));  // xavier_uniform_, gain 1
  init::uniform_(in_proj_weight, -bound, bound);
  register_parameter("in_proj_weight", in_proj_weight);
  if (bias) in_proj_bias = register_parameter("in_proj_bias", Tensor::zeros({3 * e}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, bias));
  if (bias) out_proj->bias.zero_();
}

Tensor MultiheadAttention::forward(const Tensor& x) { return forward(x, x, x, Tensor(), false).output; }

AttentionOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                            const Tensor& key_padding_mask, bool need_weights,
                                            const Tensor& attn_mask, bool average_attn_weights, bool is_causal) {
  const int64_t E = embed_dim, H = num_heads, D = head_dim;
  TANDEM_CHECK(query.defined() && key.defined() && value.defined(),
               "MultiheadAttention: query, key and value must be defined");
  const bool batched = query.dim() == 3;
  TANDEM_CHECK((query.dim() == 2 || batched) && key.dim() == query.dim() && value.dim() == query.dim(),
               "MultiheadAttention: query, key and value must all be 3-D (batched) or 2-D (unbatched), got ",
               shape_str(query.shape()), ", ", shape_str(key.shape()), ", ", shape_str(value.shape()));
  TANDEM_CHECK(query.size(-1) == E && key.size(-1) == E && value.size(-1) == E,
               "MultiheadAttention: the last dimension of query, key and value must be embed_dim = ", E, ", got ",
               shape_str(query.shape()), ", ", shape_str(key.shape()), ", ", shape_str(value.shape()));
  // To [N, L, E].
  auto to_nle = [&](const Tensor& t) {
    if (!batched) return F::unsqueeze(t, 0);
    return batch_first ? t : F::contiguous(F::transpose(t, 0, 1));
  };
  const Tensor q_in = to_nle(query), k_in = to_nle(key), v_in = to_nle(value);
  const int64_t N = q_in.size(0), L = q_in.size(1), S = k_in.size(1);
  TANDEM_CHECK(k_in.size(0) == N && v_in.size(0) == N && v_in.size(1) == S,
               "MultiheadAttention: key and value must have the query's batch size and the same length, got query ",
               shape_str(query.shape()), ", key ", shape_str(key.shape()), ", value ", shape_str(value.shape()),
               batch_first ? " (batch_first)" : " (sequence first)");

  // Projections into heads: [N, H, len, D].
  auto project = [&](const Tensor& x, int64_t part, int64_t len) {
    const Tensor w = F::narrow(in_proj_weight, 0, part * E, E);
    const Tensor b = in_proj_bias.defined() ? F::narrow(in_proj_bias, 0, part * E, E) : Tensor();
    return F::permute(F::reshape(F::linear(x, w, b), {N, len, H, D}), {0, 2, 1, 3});
  };
  // Half projections (half parameters: FSDP's mixed precision) give float32 heads: the attention
  // kernels compute in float32.
  const Tensor q = F::float32_if_half(project(q_in, 0, L)), k = F::float32_if_half(project(k_in, 1, S)),
               v = F::float32_if_half(project(v_in, 2, S));

  // One additive mask, broadcast to [N, H, L, S].
  Tensor mask;
  if (attn_mask.defined()) {
    Tensor m = additive(attn_mask, q.dtype(), "attn_mask");
    if (m.dim() == 2) {
      TANDEM_CHECK(m.size(0) == L && m.size(1) == S, "MultiheadAttention: a 2-D attn_mask must be [L, S] = [", L,
                   ", ", S, "], got ", shape_str(attn_mask.shape()));
    } else {
      TANDEM_CHECK(m.dim() == 3 && m.size(0) == N * H && m.size(1) == L && m.size(2) == S,
                   "MultiheadAttention: a 3-D attn_mask must be [N*num_heads, L, S] = [", N * H, ", ", L, ", ", S,
                   "], got ", shape_str(attn_mask.shape()));
      m = F::reshape(m, {N, H, L, S});
    }
    mask = m;
  }
  if (key_padding_mask.defined()) {
    const Shape want = batched ? Shape{N, S} : Shape{S};
    TANDEM_CHECK(key_padding_mask.shape() == want, "MultiheadAttention: key_padding_mask must be ", shape_str(want),
                 " (batch, source length), got ", shape_str(key_padding_mask.shape()));
    Tensor m = F::reshape(additive(key_padding_mask, q.dtype(), "key_padding_mask"), {N, 1, 1, S});
    mask = mask.defined() ? F::add(mask, m) : m;
  }
  // The causal mask alone goes to scaled_dot_product_attention as is_causal (which may then take the
  // fused CPU kernel); with another mask, or for the weights, it is an additive mask (added to any
  // other). Both give the same values: 0 added where attended, -inf where not.
  const double p = is_training() ? dropout : 0.0;
  const bool causal_only = is_causal && !mask.defined() && !need_weights;
  if (is_causal && !causal_only) {  // causal_mask marks with 1 what may be attended: the opposite convention
    Tensor m = F::where(F::causal_mask(L, S, q.device()), Tensor::zeros({}, q.dtype(), q.device()),
                        Tensor::full({}, -std::numeric_limits<double>::infinity(), q.dtype(), q.device()));
    mask = mask.defined() ? F::add(mask, m) : m;
  }

  Tensor heads, weights;
  if (need_weights) {
    Tensor probs = F::attention_weights(q, k, mask);
    if (p > 0.0) probs = F::dropout(probs, p, true);
    heads = F::matmul(probs, v);
    weights = average_attn_weights ? F::mean(probs, {1}) : probs;
    if (!batched) weights = F::squeeze(weights, 0);
  } else {
    heads = F::scaled_dot_product_attention(q, k, v, mask, p, causal_only);
  }
  Tensor out = out_proj->forward(F::reshape(F::permute(heads, {0, 2, 1, 3}), {N, L, E}));
  if (!batched) {
    out = F::squeeze(out, 0);
  } else if (!batch_first) {
    out = F::transpose(out, 0, 1);
  }
  return {out, weights};
}

}  // namespace tandem::nn
