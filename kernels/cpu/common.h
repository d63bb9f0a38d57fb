// Internal helpers shared by the CPU kernels (kernels/cpu/*.cpp); not part of
// the public API. Owns: float/double dispatch with a clear error for other
// dtypes, row-major Eigen map aliases, and fixed chunking of a range over the
// shared thread pool (the SIMD pieces are kernels/cpu/simd.h's). Assumes host
// tensors. Guarantees: a chunking depends only on (n, grain, num_threads()),
// so per-chunk partial results reduced in chunk order are deterministic for a
// given thread count.
#pragma once

// The SIMD layer first: its <immintrin.h>, wrapped in a GCC diagnostic pragma, must come before
// Eigen's.
#include "kernels/cpu/simd.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem::kernels::cpu::detail {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MatMap = Eigen::Map<RowMat<T>, Eigen::Unaligned>;
template <typename T>
using CMatMap = Eigen::Map<const RowMat<T>, Eigen::Unaligned>;
template <typename T>
using ArrMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>, Eigen::Unaligned>;
template <typename T>
using CArrMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>, Eigen::Unaligned>;

// Calls fn(T{}) with T = float or double according to dtype; throws otherwise.
template <typename Fn>
decltype(auto) dispatch_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::Float32:
      return fn(float{});
    case DType::Float64:
      return fn(double{});
    default:
      TANDEM_FAIL(op, ": the CPU kernel supports float32 and float64, got ", dtype_name(dtype));
  }
}

// Host tensor check for kernels called directly through cpu::.
inline void check_cpu(const char* op, const Tensor& t) {
  TANDEM_CHECK(!t.defined() || t.device().is_cpu(), op, ": expected a CPU tensor, got ", t.str());
}

// Number of chunks to cut n items into: at most one per thread, each of at
// least `grain` items, at least one.
inline int64_t num_chunks(int64_t n, int64_t grain) {
  grain = std::max<int64_t>(grain, 1);
  const int64_t by_size = (n + grain - 1) / grain;
  return std::max<int64_t>(1, std::min<int64_t>(num_threads(), by_size));
}

// Cuts [0, n) into `chunks` equal slices and runs fn(chunk, begin, end) for
// each non-empty slice, in parallel. The slices depend only on n and chunks.
template <typename Fn>
void for_each_chunk(int64_t n, int64_t chunks, Fn&& fn) {
  if (n <= 0) return;
  const int64_t step = (n + chunks - 1) / chunks;
  auto body = [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = c * step, e = std::min(n, b + step);
      if (b < e) fn(c, b, e);
    }
  };
  if (chunks <= 1) {
    body(0, 1);
  } else {
    parallel_for(0, chunks, 1, body);
  }
}

// How many of for_each_chunk(n, chunks, ...)'s slices are non-empty: the first ones.
inline int64_t used_chunks(int64_t n, int64_t chunks) {
  if (n <= 0) return 0;
  const int64_t step = (n + chunks - 1) / chunks;
  return (n + step - 1) / step;
}

// Adds the per-chunk partial sums of chunks 1..used-1 to out (which holds chunk 0's) in chunk order, so
// that the result depends on the thread count only: chunk c's `count` values start at first + c * stride.
template <typename T>
void add_chunk_partials(T* out, const T* first, int64_t stride, int64_t count, int64_t used) {
  for (int64_t c = 1; c < used; ++c) {
    const T* part = first + c * stride;
    for (int64_t i = 0; i < count; ++i) out[i] += part[i];
  }
}

// parallel_for over [0, n) with a grain, skipping the pool when one chunk suffices.
template <typename Fn>
void parallel_range(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  if (n <= grain || num_threads() == 1) {
    fn(int64_t{0}, n);
    return;
  }
  parallel_for(0, n, grain, fn);
}

}  // namespace tandem::kernels::cpu::detail
