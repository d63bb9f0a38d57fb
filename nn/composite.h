// Differentiable ops built for general networks (transformers, MLPs on any rank), PyTorch's names
// and semantics. float32 and float64 on CPU; on CUDA float32, and float64 but for dropout
// (dropout's mask on CUDA comes from a counter-based generator seeded from `gen`: see
// kernels/pointwise.h).
//   matmul    torch.matmul: 1-D/1-D dot product, 2-D product (the CUDA-capable kernel), 1-D operands
//             promoted and the added dimension removed, batch dimensions broadcast ([..., M, K] x
//             [..., K, N], via bmm)
//   bmm       [B, M, K] x [B, K, N]
//   softmax   on any dimension (log_softmax is declared in nn/functional.h, also any dimension)
//   dropout   in training, zeroes each element with probability p and scales the rest by 1/(1-p);
//             the identity in eval or when p == 0. The mask is drawn from `gen` (or from
//             default_generator(), core/random.h): seed it (per rank, e.g. seed + rank) for
//             reproducible masks.
//   layer_norm  over the trailing dimensions given by normalized_shape (biased variance, eps
//             inside the square root); weight and bias optional (undefined tensors); one fused
//             CPU kernel each way (kernels/layer_norm.h)
//   embedding weight [num_embeddings, D] looked up by int64/int32 indices of any shape -> [..., D];
//             padding_idx (negative counts from the end) gets no gradient, as PyTorch
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace tandem::nn::functional {

Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);  // default_generator()
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace tandem::nn::functional
