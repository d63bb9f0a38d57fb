// Attention, PyTorch's names and semantics, composed of the differentiable ops of nn/composite.h
// and nn/pointwise.h (so its gradients follow from theirs). float32 and float64 on CPU.
//   scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, gen) as torch 2.x's
//       F.scaled_dot_product_attention: q [..., L, E], k [..., S, E], v [..., S, Ev] (batch
//       dimensions broadcast as matmul's) -> [..., L, Ev] =
//       dropout(softmax(q k^T / sqrt(E) + mask, -1), dropout_p) v.
//       attn_mask (optional, broadcast to [..., L, S]): uint8 (torch.bool as 0/1) where 1 means
//       "may attend" (0 -> -inf before the softmax), or a float mask of q's dtype that is added.
//       is_causal: position i attends to j <= i (the upper-left lower triangle, as PyTorch); it
//       cannot be combined with attn_mask. A row with no allowed position gives NaN, as PyTorch.
//       The dropout mask comes from `gen` (default_generator() in the overload without it).
//   MultiheadAttention: nn::MultiheadAttention in nn/attention_layer.h.
// Bad shapes, dtypes and arguments throw tandem::Error naming the argument.
#pragma once

#include "core/random.h"
#include "core/tensor.h"

namespace tandem::nn::functional {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, Generator& gen);
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false);

// The attention probabilities alone: softmax(q k^T / sqrt(E) + mask, -1), [..., L, S], masks as
// above (no dropout). MultiheadAttention's need_weights returns their mean over the heads.
Tensor attention_weights(const Tensor& q, const Tensor& k, const Tensor& attn_mask = Tensor(),
                         bool is_causal = false);

// The [L, S] uint8 mask of is_causal: 1 where j <= i (built on the host, returned on `device`).
Tensor causal_mask(int64_t L, int64_t S, Device device = Device::cpu());

}  // namespace tandem::nn::functional
