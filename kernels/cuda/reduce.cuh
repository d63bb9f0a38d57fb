// Internal device helpers shared by the .cu files of kernels/cuda: warp and block sums, block
// maxima (plain, and first-maximum with its index; float or double), and the grid-stride loop. Assumes blockDim.x
// is a multiple of 32 and at most 1024.
#pragma once

#include <cmath>
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

// (v, i) beats (w, j) when it is the first maximum: NaN beats numbers, larger beats smaller,
// and equal values (or two NaNs) go to the lower index (torch.max / torch.argmax).
template <typename T>
__device__ __forceinline__ bool beats(T v, int64_t i, T w, int64_t j) {
  const bool vn = isnan(v), wn = isnan(w);
  if (vn != wn) return vn;
  if (!vn && v != w) return v > w;
  return i < j;
}

// The first maximum (by beats) of the warp's (v, i) pairs, in every lane (beats is a total order,
// so the butterfly gives each lane the same pair). All 32 lanes must call it.
template <typename T>
__device__ __forceinline__ void warp_argmax(T& v, int64_t& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const T w = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t j = __shfl_xor_sync(0xffffffffu, i, o);
    if (beats(w, j, v, i)) {
      v = w;
      i = j;
    }
  }
}

// The first maximum (by beats) of the block's (v, i) pairs, returned to every thread in v and i.
// A thread without an element passes (-inf, INT64_MAX). Synchronises, as block_sum.
template <typename T>
__device__ inline void block_argmax(T& v, int64_t& i) {
  __shared__ T warp_v[32];
  __shared__ int64_t warp_i[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_argmax(v, i);
  __syncthreads();
  if (lane == 0) {
    warp_v[warp] = v;
    warp_i[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    v = lane < nwarps ? warp_v[lane] : T(-INFINITY);
    i = lane < nwarps ? warp_i[lane] : INT64_MAX;
    warp_argmax(v, i);
    if (lane == 0) {
      warp_v[0] = v;
      warp_i[0] = i;
    }
  }
  __syncthreads();
  v = warp_v[0];
  i = warp_i[0];
}

// fmax in the element type: NaN ignored unless both are NaN.
__device__ __forceinline__ float tmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double tmax(double a, double b) { return fmax(a, b); }

// The largest v over the block (fmax: NaN ignored unless all are NaN), returned to every thread.
template <typename T>
__device__ inline T block_max(T v) {
  __shared__ T warp_max[32];
  __shared__ T total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = tmax(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    T w = lane < nwarps ? warp_max[lane] : T(-INFINITY);
    for (int o = 16; o > 0; o >>= 1) w = tmax(w, __shfl_down_sync(0xffffffffu, w, o));
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

// Column sums of [len, inner] slabs in tiles: a block of kColumnTile x kColumnLanes threads owns kColumnTile
// neighbouring columns (threadIdx.x: neighbouring addresses), and its threadIdx.y-th lane walks the rows
// y, y + kColumnLanes, ...; column_tile_sum() then adds the lanes' K partial sums in lane order through shared
// memory, so the result depends only on the shape (no atomics). The sums come back complete in lane 0
// (threadIdx.y == 0). Every thread of the block must call it (it synchronises). A thread per column walking
// all rows, as before, left a 768-wide LayerNorm with 3 blocks.
constexpr int kColumnTile = 32, kColumnLanes = 8;

template <int K>
__device__ void column_tile_sum(double (&acc)[K]) {
  __shared__ double lanes[K][kColumnLanes][kColumnTile];
  __syncthreads();  // a previous call's readers are done
  for (int k = 0; k < K; ++k) lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0) {
    for (int k = 0; k < K; ++k) {
      double s = 0;
      for (int l = 0; l < kColumnLanes; ++l) s += lanes[k][l][threadIdx.x];
      acc[k] = s;
    }
  }
}

}  // namespace tandem::kernels::cuda
