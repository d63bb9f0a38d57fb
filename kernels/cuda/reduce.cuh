// Internal device helpers shared by the .cu files of kernels/cuda: warp and block sums and the
// grid-stride loop. Assumes blockDim.x is a multiple of 32 and at most 1024.
#pragma once

#include <cstdint>

namespace tandem::kernels::cuda {

// for (i over [0, n)) spread over the whole grid.
#define TANDEM_GRID_STRIDE_LOOP(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n);             \
       i += int64_t(gridDim.x) * blockDim.x)

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;  // complete in lane 0
}

// Sum of v over the block, returned to every thread. Every thread of the block must call it the
// same number of times (it synchronises).
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[32];
  __shared__ T total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call's readers are done with warp_sums and total
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    T w = lane < nwarps ? warp_sums[lane] : T(0);
    w = warp_sum(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

}  // namespace tandem::kernels::cuda
