// Internal: the 1x1 stride-2 projections without padding (kernels/cpu/conv_strided.h's plain
// projections) with channels in the vector lanes instead of positions, where the channel counts fit
// one or two vectors. The positions-in-lanes kernels must first gather the even pixels of the even rows
// (a permute and a store a row, a quarter of their time); here each input pixel is a broadcast read
// straight from x or gy in its multiply-add, and the channels are transposed into rows once per output
// row, in registers. AVX-512 only (the callers compile it only there).
// Forward (projection_lanes_forward): an accumulator per output position of a row, its lanes the output
// channels (up to 32: one vector, maps at most 16 wide, or two, at most 8 wide), each step a vector of
// the weights of one input channel and the row's pixels of that channel broadcast; the bias is the
// accumulators' start. Input gradient (projection_lanes_input_grad): an accumulator per output position
// of a row, its lanes the input channels (up to 32, maps at most 16 wide), each step a row of the weights
// and the row's gy values broadcast; each channel's values expanded to the even columns of its image row by
// one zero-masking permute, the odd columns and rows written as zeros (or, for the pair's in-place sum,
// only the even pixels read and written).
// Guarantees: as conv_strided_forward and conv_strided_input_grad, the products summed in increasing order
// of input (forward, after the bias) or output channels, so the values are bitwise those of the
// positions-in-lanes kernels.
#pragma once

#include <cstdint>

#include "kernels/cpu/conv_strided.h"

namespace tandem::kernels::cpu::detail {

// True for the shapes projection_lanes_forward takes (a plain projection, K <= 16 with Q <= 16 or
// K <= 32 with Q <= 8).
bool projection_lanes_forward_supported(const StridedConvShape& g);

// y[n] = w * x[n] (+ b) for n in [n0, n1), as conv_strided_forward.
void projection_lanes_forward(const float* x, const float* w, const float* b, float* y, int64_t n0, int64_t n1,
                              const StridedConvShape& g);

// True for the shapes projection_lanes_input_grad takes (a plain projection, C <= 32, maps at most 16
// wide).
bool projection_lanes_input_grad_supported(const StridedConvShape& g);

// gx[n] = the input gradient for n in [n0, n1), as conv_strided_input_grad; with add, added into gx's even
// pixels in place instead, nothing else read or written (conv_strided_projection_input_grad_add).
void projection_lanes_input_grad(const float* gy, const float* w, float* gx, int64_t n0, int64_t n1,
                                 const StridedConvShape& g, bool add);

}  // namespace tandem::kernels::cpu::detail
