// Fused scaled dot-product attention on CPU, without a mask or with the causal one, no dropout:
// q [B, L, E], k [B, S, E], v [B, S, Ev] (B the flattened batch x heads; any strides, read through
// contiguous copies where needed) -> output [B, L, Ev] = softmax(q k^T * scale (+ causal -inf)) v,
// with the per-row logsumexp of the scaled scores, lse [B, L], saved for the backward instead of
// the [L, S] probabilities. The backward recomputes the probabilities P = exp(s - lse) block by
// block (FlashAttention's recurrence): dV = P^T dO, dP = dO V^T, D = rowsum(dO * O),
// dS = P * (dP - D), dQ = dS k * scale, dK = dS^T q * scale.
// is_causal: row i attends to the columns j <= i (PyTorch's upper-left convention); L, S >= 1.
// float32 and float64, CPU only (on CUDA nn/attention.cpp composes the op from its CUDA kernels).
// Guarantees: each batch entry is computed by one thread in a fixed order of blocks, so the bits
// do not depend on the thread count.
#pragma once

#include "core/tensor.h"

namespace tandem::kernels {

struct AttentionForward {
  Tensor output, lse;  // [B, L, Ev], [B, L]
};
struct AttentionGrads {
  Tensor q, k, v;
};

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool is_causal);
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale, bool is_causal);

}  // namespace tandem::kernels
