// Internal: the float32 planes of the CPU's fused batch norm + relu + 2x2 max-pool
// (kernels/cpu/batch_norm_pool.cpp) that the fused conv + batch norm (kernels/cpu/conv_bn_pool.cpp) runs on
// conv images it computes itself. Each is the function the fused batch norm runs on a plane of its
// input (same instructions, same bits).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/batch_norm_stats.h"

namespace tandem::kernels::cpu::detail {

// The forward's pooling of one plane x [H, W] with its affine map (a, b): y, code and xw [H/2, W/2].
void bn_pool_forward_plane(const float* x, int64_t H, int64_t W, float a, float b, float* y, uint8_t* code,
                           float* xw);

// The backward's first pass over the pooled planes of l.N images (pooled plane size PQ; gy and winner
// [N, C, PQ]): the weight and bias gradients (into gw / gb where non-null) and each channel's
// coefficients of the input gradient.
std::vector<BnGradCoef<float>> bn_pool_grad_coefficients(const float* gy, const float* winner, const BnLayout& l,
                                                         int64_t PQ, const std::vector<BnAffine<float>>& affine,
                                                         const float* mean, const float* invstd, const float* w,
                                                         bool training, float* gw, float* gb);

// The input gradient of one plane x [H, W] (its pooled winner, gradient and code [H/2, W/2]) into gx [H, W].
void bn_pool_input_grad_plane(const float* x, const float* xw, const float* dy, const uint8_t* code, int64_t H,
                              int64_t W, const BnAffine<float>& affine, float mean, const BnGradCoef<float>& f,
                              float* gx, bool eval);

}  // namespace tandem::kernels::cpu::detail
