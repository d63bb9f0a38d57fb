// The oneDNN matmul (see kernels/cpu/dnnl.h: MatmulSplit, detail::onednn_matmul): primitives
// cached per shape, strides and dtypes (kernels/cpu/dnnl_internal.h), each call cut over the
// engine's pool by the split rules. Bits: depend on the shapes, dtypes, the thread count and
// oneDNN's ISA; not on timing (slices fixed by those, partial sums added in slice order).
#include "kernels/cpu/common.h"  // first: kernels/cpu/simd.h's <immintrin.h> before any other
#include "kernels/cpu/dnnl.h"
#include "kernels/cpu/dnnl_internal.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"

namespace tandem::kernels::cpu {
namespace {

std::atomic<uint64_t> g_matmul_splits[kMatmulSplits];

}  // namespace

uint64_t matmul_split_count(MatmulSplit split) {
  return g_matmul_splits[static_cast<int>(split)].load(std::memory_order_relaxed);
}

#if !defined(TANDEM_WITH_ONEDNN)

namespace detail {
bool onednn_matmul(const MatView&, const MatView&, const Tensor&, Tensor&, bool) { return false; }
bool pair_linear_gradients(int64_t) { return false; }
bool run_pair(const std::function<bool()>& first, const std::function<bool()>& second) {
  const bool a = first();
  return second() && a;
}
}  // namespace detail

#else

namespace {

using namespace onednn;

// ---- matmul ----
struct MatmulEntry {
  dnnl::matmul prim;
  memory::desc a, b, c, bias, scratchpad;
};

// c (rows x cols at c_data, row stride ldc, dtype c_dtype) = a * b (+ bias) on the calling thread.
bool matmul_one(const detail::MatView& a, const detail::MatView& b, const void* bias, DType bias_dtype,
                void* c_data, DType c_dtype, int64_t ldc) {
  dnnl::stream& s = stream_for_call();  // first: oneDNN sizes a primitive by the team it sees
  const int64_t M = a.rows, K = a.cols, N = b.cols;
  const std::string key =
      make_key("matmul", M, K, N, a.row_stride, a.col_stride, b.row_stride, b.col_stride, ldc,
               static_cast<int>(a.dtype), static_cast<int>(b.dtype), static_cast<int>(c_dtype),
               bias ? int(bias_dtype) : -1);
  auto entry = cached<MatmulEntry>(key, [&] {
    memory::desc amd({M, K}, to_dnnl(a.dtype), memory::dims{a.row_stride, a.col_stride});
    memory::desc bmd({K, N}, to_dnnl(b.dtype), memory::dims{b.row_stride, b.col_stride});
    memory::desc cmd({M, N}, to_dnnl(c_dtype), memory::dims{ldc, 1});
    memory::desc biasmd = bias ? memory::desc({1, N}, to_dnnl(bias_dtype), Tag::ab) : memory::desc();
    dnnl::matmul::primitive_desc pd(
        bias ? dnnl::matmul::desc(amd, bmd, biasmd, cmd) : dnnl::matmul::desc(amd, bmd, cmd), user_scratchpad(),
        engine());
    if (!native_impl(pd.impl_info_str(), a.dtype)) return std::shared_ptr<const MatmulEntry>();
    return std::make_shared<const MatmulEntry>(MatmulEntry{dnnl::matmul(pd), amd, bmd, cmd, biasmd, pd.scratchpad_desc()});
  });
  if (!entry) return false;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(entry->a, engine(), const_cast<void*>(a.data))},
                                       {DNNL_ARG_WEIGHTS, memory(entry->b, engine(), const_cast<void*>(b.data))},
                                       {DNNL_ARG_DST, memory(entry->c, engine(), c_data)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(entry->bias, engine(), const_cast<void*>(bias)));
  std::vector<Tensor> keep;  // the pooled scratchpad, until the call ends
  add_scratchpad(args, entry->scratchpad, keep);
  entry->prim.execute(s, args);
  s.wait();
  return true;
}

// ---- how a matmul is cut over the pool (see MatmulSplit in the header) ----
bool row_major(const detail::MatView& m) { return m.col_stride == 1 && m.row_stride == m.cols; }
bool col_major(const detail::MatView& m) { return m.row_stride == 1 && m.col_stride == m.rows; }

// Depth slices at least this deep: below it the f32 partials' sum (M * N per slice) stops being
// small beside the slice's product (M * N * depth).
constexpr int64_t kMinDepthSlice = 128;

struct MatmulPlan {
  MatmulSplit split;
  int64_t slices;
};

MatmulPlan matmul_plan(const detail::MatView& a, const detail::MatView& b, bool bias) {
  const int64_t M = a.rows, K = a.cols, N = b.cols;
  const int64_t by_rows = row_major(a) ? slices_for(M, K * N) : 1;
  const int64_t by_cols = col_major(b) ? slices_for(N, K * M) : 1;
  const int64_t by_depth =
      !bias && col_major(a) && row_major(b)
          ? cpu::detail::num_chunks(K, std::max(kMinDepthSlice, (int64_t{1} << 20) / std::max<int64_t>(1, M * N)))
          : 1;
  if (by_rows > 1 && (M >= N || by_cols == 1)) return {MatmulSplit::rows, by_rows};
  if (by_cols > 1) return {MatmulSplit::cols, by_cols};
  if (by_depth > 1) return {MatmulSplit::depth, by_depth};
  return {MatmulSplit::whole, 1};
}

void count_matmul_split(MatmulSplit split) {
  g_matmul_splits[static_cast<int>(split)].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

namespace detail {

bool pair_linear_gradients(int64_t work) { return num_threads() == 2 && work >= (int64_t{1} << 20); }

bool run_pair(const std::function<bool()>& first, const std::function<bool()>& second) {
  return over_slices(2, 2, [&](int64_t s, int64_t, int64_t) { return s == 0 ? first() : second(); });
}

bool onednn_matmul(const MatView& a, const MatView& b, const Tensor& bias, Tensor& c, bool paired) {
  const int64_t M = a.rows, K = a.cols, N = b.cols;
  if (M == 0 || K == 0 || N == 0) return false;
  const DType bias_dtype = bias.defined() ? bias.dtype() : kFloat32;
  for (DType d : {a.dtype, b.dtype, c.dtype(), bias_dtype}) {
    if (to_dnnl(d) == DnnlType::undef) return false;
  }
  const DType cd = c.dtype();
  char* c_data = static_cast<char*>(c.raw_data());
  const void* bp = bias.defined() ? bias.raw_data() : nullptr;
  const MatmulPlan plan = paired ? MatmulPlan{MatmulSplit::paired, 1} : matmul_plan(a, b, bias.defined());
  count_matmul_split(plan.split);
  switch (plan.split) {
    case MatmulSplit::whole:
    case MatmulSplit::paired:
      return matmul_one(a, b, bp, bias_dtype, c_data, cd, N);
    case MatmulSplit::rows:  // row slices of a and c: each dense
      return over_slices(M, plan.slices, [&](int64_t, int64_t r0, int64_t r1) {
        const MatView as{offset(a.data, r0 * a.row_stride, a.dtype), a.dtype, r1 - r0, K, a.row_stride, a.col_stride};
        return matmul_one(as, b, bp, bias_dtype, c_data + r0 * N * elem_size(cd), cd, N);
      });
    case MatmulSplit::cols:  // column slices of b (dense, transposed) into dense buffers, copied into c
      return over_slices(N, plan.slices, [&](int64_t, int64_t c0, int64_t c1) {
        const MatView bs{offset(b.data, c0 * b.col_stride, b.dtype), b.dtype, K, c1 - c0, b.row_stride, b.col_stride};
        std::vector<char> part(static_cast<size_t>(M * (c1 - c0) * elem_size(cd)));
        if (!matmul_one(a, bs, bp ? offset(bp, c0, bias_dtype) : nullptr, bias_dtype, part.data(), cd, c1 - c0))
          return false;
        const size_t row_bytes = static_cast<size_t>((c1 - c0) * elem_size(cd));
        for (int64_t i = 0; i < M; ++i)
          std::memcpy(c_data + (i * N + c0) * elem_size(cd), part.data() + i * row_bytes, row_bytes);
        return true;
      });
    case MatmulSplit::depth:  // slices of the depth: one f32 partial each, summed in slice order
      break;
  }
  std::vector<Tensor> parts(static_cast<size_t>(plan.slices));
  const bool ok = over_slices(K, plan.slices, [&](int64_t s, int64_t k0, int64_t k1) {
    parts[s] = Tensor::empty({M, N}, kFloat32);
    const MatView as{offset(a.data, k0 * a.col_stride, a.dtype), a.dtype, M, k1 - k0, a.row_stride, a.col_stride};
    const MatView bs{offset(b.data, k0 * b.row_stride, b.dtype), b.dtype, k1 - k0, N, b.row_stride, b.col_stride};
    return matmul_one(as, bs, nullptr, kFloat32, parts[s].raw_data(), kFloat32, N);
  });
  if (ok) sum_parts_into(parts, c);
  return ok;
}

}  // namespace detail

#endif  // TANDEM_WITH_ONEDNN

}  // namespace tandem::kernels::cpu
