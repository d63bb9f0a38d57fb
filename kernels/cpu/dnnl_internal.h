// Internal to the oneDNN layer's .cpp files (kernels/cpu/dnnl.cpp, dnnl_matmul.cpp): the engine,
// the calling thread's stream, the bounded primitive cache and the slicing over the engine's pool
// (see kernels/cpu/dnnl.cpp's opening comment). Includes oneDNN's headers: never include it from
// a header, and only where TANDEM_WITH_ONEDNN is defined.
#pragma once

#if defined(TANDEM_WITH_ONEDNN)
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/dnnl.h"

namespace tandem::kernels::cpu::onednn {

using dnnl::memory;
using Tag = memory::format_tag;
using DnnlType = memory::data_type;

inline dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The calling thread's stream. oneDNN runs single-threaded on each calling thread (an OpenMP team
// of one: no OpenMP worker thread ever exists); the engine's pool splits the work (see the header).
inline dnnl::stream& stream_for_call() {
  thread_local bool team_of_one = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)team_of_one;
  thread_local dnnl::stream s(engine());
  return s;
}

inline DnnlType to_dnnl(DType d) {
  switch (d) {
    case DType::Float32:
      return DnnlType::f32;
    case DType::BFloat16:
      return DnnlType::bf16;
    case DType::Float16:
      return DnnlType::f16;
    default:
      return DnnlType::undef;
  }
}

inline bool has_isa(dnnl_cpu_isa_t isa) {
  const unsigned effective = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (effective & static_cast<unsigned>(isa)) == static_cast<unsigned>(isa);
}

// Whether a primitive computing in `compute` is one of oneDNN's native low-precision kernels: for
// bf16, an implementation named for bf16 or AMX ("jit_bf16:avx512_core_bf16", "brg:avx512_core_amx",
// ...). oneDNN falls back to a GEMM-based bf16 convolution for some shapes (ResNet's 8-channel
// weight gradient: "x64:gemm:jit", ~12 GFLOP/s at 1 thread on Zen 4, below the f32 kernels); those
// count as unavailable, so the caller widens instead.
inline bool native_impl(const char* impl, DType compute) {
  if (compute != kBFloat16) return true;
  const std::string s(impl ? impl : "");
  return s.find("bf16") != std::string::npos || s.find("amx") != std::string::npos;
}

// ---- the primitive cache ----
constexpr size_t kMaxCached = 512;

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const void>> map;
};

inline Cache& cache() {
  static Cache c;
  return c;
}

// The entry for key, built by make() (returning a shared_ptr<const T>, null when oneDNN has no
// implementation: remembered, so the failure is not retried on every call).
template <typename T, typename Make>
std::shared_ptr<const T> cached(const std::string& key, Make&& make) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.map.find(key);
    if (it != c.map.end()) return std::static_pointer_cast<const T>(it->second);
  }
  std::shared_ptr<const T> built;
  try {
    built = make();
  } catch (const dnnl::error&) {
    built = nullptr;
  }
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.map.size() >= kMaxCached) c.map.clear();
  c.map.emplace(key, built);
  return built;
}

inline void append_key(std::string& key) { (void)key; }
template <typename First, typename... Rest>
void append_key(std::string& key, First first, Rest... rest) {
  key += std::to_string(static_cast<int64_t>(first));
  key += ',';
  append_key(key, rest...);
}
template <typename... Args>
std::string make_key(const char* kind, Args... args) {
  std::string key(kind);
  key += ':';
  append_key(key, args...);
  return key;
}

inline int64_t elem_size(DType d) { return d == kFloat32 ? 4 : 2; }

// The number of slices a call over n items of `work_per_item` multiply-adds is cut into: one per
// thread of the engine's pool (num_threads()), each of >= 2^20 multiply-adds, at most n. One
// slice at 1 thread: slicing costs oneDNN efficiency (smaller problems per call), so the bits are
// those of the thread count, as the Eigen paths' are.
inline int64_t slices_for(int64_t n, int64_t work_per_item) {
  return cpu::detail::num_chunks(n, std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, work_per_item)));
}

// Runs fn(slice, begin, end) over [0, n) cut into `slices` equal slices, in parallel on the
// engine's pool; true when every slice's fn returned true (a oneDNN error counts as false).
template <typename Fn>
bool over_slices(int64_t n, int64_t slices, Fn&& fn) {
  std::atomic<bool> ok{true};
  cpu::detail::for_each_chunk(n, slices, [&](int64_t c, int64_t b, int64_t e) {
    bool done = false;
    try {
      done = fn(c, b, e);
    } catch (const dnnl::error&) {  // e.g. a scratchpad it could not allocate: the caller falls back
      done = false;
    }
    if (!done) ok.store(false, std::memory_order_relaxed);
  });
  return ok.load();
}

// A oneDNN memory of layout md on a buffer from the engine's caching allocator (core/allocator.h),
// held in `keep` until the caller's call ends. oneDNN's own buffers (memory(md, engine())) are fresh
// mallocs per execution: blocked copies of a batch's activations run to MiBs, glibc maps and unmaps
// them each time, and their page faults took 12-18% of the ResNet bf16 step (bench/PERF_NOTES.md
// section 18); the allocator's blocks are reused from step to step. 64-byte aligned.
inline memory pooled_memory(const memory::desc& md, std::vector<Tensor>& keep) {
  const int64_t floats = static_cast<int64_t>((md.get_size() + sizeof(float) - 1) / sizeof(float));
  keep.push_back(Tensor::empty({std::max<int64_t>(floats, 1)}, kFloat32));
  return memory(md, engine(), keep.back().raw_data());
}

// The scratchpad a primitive asks for (user mode: one per execution, so concurrent executions of
// one primitive on the pool's threads never share one), on a pooled buffer.
inline void add_scratchpad(std::unordered_map<int, memory>& args, const memory::desc& md, std::vector<Tensor>& keep) {
  if (md.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, pooled_memory(md, keep));
}

inline dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

inline const char* offset(const void* p, int64_t elems, DType d) {
  return static_cast<const char*>(p) + elems * elem_size(d);
}

// out (any shape, contiguous, f32 or a low-precision dtype) = the sum of the f32 parts (out's
// shape each) in part order, rounded once to out's dtype (kernels/cpu/dnnl.cpp).
void sum_parts_into(std::vector<Tensor>& parts, Tensor& out);

}  // namespace tandem::kernels::cpu::onednn

#endif  // TANDEM_WITH_ONEDNN
