// Copies between the plain NCHW layout and the channel-blocked one oneDNN's convolutions compute in
// (nChw16c, oneDNN's aBcd16b: [N, C/16, H, W, 16]); internal, used by kernels/cpu/dnnl.cpp in place
// of oneDNN's own reorders, which handle these odd spatial sizes (MnistNet's 11x11 and 13x13) at a
// third of the speed of a 16x16 register transpose (bench/PERF_NOTES.md section 20).
// Assumes: dense buffers of N * C * HW elements, not overlapping; f32 or bf16 (uint16_t bits) on
// either side.
// Guarantees: the same values oneDNN's reorder writes: exact between like types and from bf16 to
// f32; f32 to bf16 rounds to nearest even (a NaN stays a quiet NaN) as kernels/cpu/simd.h's
// store_first. Returns false, writing nothing, where it has no kernel (builds below AVX-512, C not
// a multiple of 16, another dtype): the caller reorders through oneDNN then.
// Single-threaded: oneDNN's calls already run one batch slice per thread.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tandem::kernels::cpu::detail {

// src [N, C, HW] of src_type to dst [N, C/16, HW, 16] of dst_type.
bool to_channel_blocked16(const void* src, DType src_type, void* dst, DType dst_type, int64_t N, int64_t C,
                          int64_t HW);

// src [N, C/16, HW, 16] of src_type to dst [N, C, HW] of dst_type.
bool from_channel_blocked16(const void* src, DType src_type, void* dst, DType dst_type, int64_t N, int64_t C,
                            int64_t HW);

}  // namespace tandem::kernels::cpu::detail
