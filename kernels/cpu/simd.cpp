// The record of which path the CPU kernels took (kernels/cpu/simd.h): one counter per (kernel,
// level), incremented once per kernel call with a relaxed atomic add, read by tests.
#include "kernels/cpu/simd.h"

#include <atomic>

namespace tandem::kernels::cpu {
namespace {

static_assert(static_cast<int>(SimdKernel::conv2d_pair_backward) + 1 == kSimdKernels, "kSimdKernels: one per kernel");
static_assert(static_cast<int>(SimdLevel::avx512) + 1 == kSimdLevels, "kSimdLevels: one per level");

std::atomic<uint64_t> g_paths[kSimdKernels][kSimdLevels];

}  // namespace

SimdLevel compiled_simd_level() { return kSimdLevel; }

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::avx512:
      return "avx512";
    case SimdLevel::avx2:
      return "avx2";
    case SimdLevel::portable:
      break;
  }
  return "portable";
}

uint64_t simd_path_count(SimdKernel kernel, SimdLevel level) {
  return g_paths[static_cast<int>(kernel)][static_cast<int>(level)].load(std::memory_order_relaxed);
}

namespace detail {
void count_simd_path(SimdKernel kernel, SimdLevel level) {
  g_paths[static_cast<int>(kernel)][static_cast<int>(level)].fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

}  // namespace tandem::kernels::cpu
