// MultiheadAttention with torch.nn.MultiheadAttention's parameters, names, initialisation and
// masks, so a state_dict moves between the two:
//   in_proj_weight [3E, E] (xavier_uniform), in_proj_bias [3E] (zeros), out_proj.weight [E, E]
//   (Linear's default), out_proj.bias [E] (zeros); without bias neither bias exists.
// Inputs are [N, L, E] with batch_first (the default here), [L, N, E] without it, or unbatched
// [L, E]; key and value may have their own length S. Masks follow torch.nn.MultiheadAttention
// (not scaled_dot_product_attention): a uint8 attn_mask ([L, S] or [N*H, L, S]) or
// key_padding_mask ([N, S] or [S]) marks with 1 the positions that may NOT be attended; a float
// mask of the inputs' dtype is added to the scores. is_causal adds the causal mask (position i
// sees j <= i) on top of any attn_mask. Dropout on the attention probabilities in training only.
// forward(x) is self-attention without masks; forward(query, key, value, ...) returns the output
// and, with need_weights, the attention probabilities ([N, L, S] averaged over heads, or
// [N, H, L, S]; after dropout, as PyTorch 1.13), computed on the projected heads with the ops of
// nn/attention.h.
#pragma once

#include <cstdint>
#include <memory>

#include "nn/layers.h"
#include "nn/module.h"

namespace tandem::nn {

struct AttentionOutput {
  Tensor output;   // as the query
  Tensor weights;  // undefined unless need_weights
};

class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = true);
  Tensor forward(const Tensor& x) override;  // self-attention, no masks, no weights
  AttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                          const Tensor& key_padding_mask = Tensor(), bool need_weights = true,
                          const Tensor& attn_mask = Tensor(), bool average_attn_weights = true,
                          bool is_causal = false);

  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;
  const int64_t embed_dim, num_heads, head_dim;
  const double dropout;
  const bool batch_first;
};

}  // namespace tandem::nn
