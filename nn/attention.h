// Attention, PyTorch's names and semantics, composed of the differentiable ops of nn/composite.h
// and nn/pointwise.h (so its gradients follow from theirs). float32 and float64 on CPU.
//   scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, gen, scale) as torch
//       2.x's F.scaled_dot_product_attention: q [..., L, E], k [..., S, E], v [..., S, Ev] (batch
//       dimensions broadcast as matmul's) -> [..., L, Ev] =
//       dropout(softmax(q k^T * scale + mask, -1), dropout_p) v, scale 1 / sqrt(E) unless given
//       (any finite value; PyTorch's `scale` keyword).
//       attn_mask (optional, broadcast to [..., L, S]): uint8 (torch.bool as 0/1) where 1 means
//       "may attend" (0 -> -inf before the softmax), or a float mask of q's dtype that is added.
//       is_causal: position i attends to j <= i (the upper-left lower triangle, as PyTorch); it
//       cannot be combined with attn_mask. A row with no allowed position gives NaN, as PyTorch.
//       The dropout mask comes from `gen` (default_generator() in the overload without it).
//       On the CPU with dropout_p == 0 and no attn_mask (is_causal or not) it runs as one fused
//       kernel (kernels/attention.h: no [L, S] probabilities kept for the backward, which
//       recomputes them); elsewhere (CUDA, dropout, masks) as the composition. Both agree to
//       rounding; set_fused_attention(false) forces the composition.
//   MultiheadAttention: nn::MultiheadAttention in nn/attention_layer.h.
// Bad shapes, dtypes and arguments throw tandem::Error naming the argument.
#pragma once

#include <optional>

#include "core/random.h"
#include "core/tensor.h"

namespace tandem::nn::functional {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, Generator& gen,
                                    std::optional<double> scale = std::nullopt);
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

// Whether the CPU fused kernel may be used (default true; process-wide, read at each call), and
// whether a call with these arguments takes it.
void set_fused_attention(bool enabled);
bool fused_attention_enabled();
bool fused_attention_path(const Tensor& q, const Tensor& k, const Tensor& attn_mask, double dropout_p);

// The attention probabilities alone: softmax(q k^T / sqrt(E) + mask, -1), [..., L, S], masks as
// above (no dropout). MultiheadAttention's need_weights returns their mean over the heads.
Tensor attention_weights(const Tensor& q, const Tensor& k, const Tensor& attn_mask = Tensor(),
                         bool is_causal = false);

// The [L, S] uint8 mask of is_causal: 1 where j <= i. Built on the host; on a CUDA device it is
// uploaded once per (L, S, device) and the same tensor returned after (read it, never write it).
Tensor causal_mask(int64_t L, int64_t S, Device device = Device::cpu());

}  // namespace tandem::nn::functional
