// The CPU kernels' oneDNN layer (see kernels/cpu/dnnl.h). One engine; a stream per calling thread;
// the primitives (matmul, convolution forward / backward-data / backward-weights) built once per
// key (kind, shapes, strides, dtypes) and kept in a bounded map (kMaxCached entries; when full it
// is emptied and refilled, so a long run over many shapes rebuilds at worst, never grows).
// Threading: oneDNN (Debian's build) runs on OpenMP (libgomp), whose idle workers spin for
// GOMP_SPINCOUNT (~300k pauses, milliseconds) after each parallel region; libgomp reads its
// settings once at load time, so the library cannot change them. Beside the engine's own pool
// (core/thread_pool.h) on a 2-core machine those spinning workers halved the step (MNIST bf16 at 2
// threads: 553 samples/s against 3080 in f32). So no OpenMP worker ever runs: every calling thread
// sets its OpenMP team to one (omp_set_num_threads(1), before oneDNN builds a primitive, since a
// primitive's work split follows the team it sees), and the engine's pool runs each call as one
// slice per thread (slices_for): a matmul as MatmulSplit in kernels/cpu/dnnl.h says (slices that
// keep every operand dense, so oneDNN's native bf16 kernel takes each), the batch of a
// convolution; weight gradients (convolution batch slices, matmul depth slices) sum one f32
// partial per slice in slice order. Primitives run with user scratchpads (one per execution), so
// slices may share a primitive.
// Bits: depend on the shapes, dtypes, the thread count and oneDNN's ISA; not on timing.
#include "kernels/cpu/common.h"  // first: kernels/cpu/simd.h's <immintrin.h> before any other
#include "kernels/cpu/dnnl.h"
#include "kernels/ops.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/block_layout.h"
#include "kernels/cpu/dnnl_internal.h"

namespace tandem::kernels::cpu {
namespace {

std::atomic<uint64_t> g_gemm_paths[kGemmKernels][kGemmPaths];

}  // namespace

const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::eigen:
      return "eigen";
    case GemmPath::small_gemm:
      return "small_gemm";
    case GemmPath::onednn_f32:
      return "onednn_f32";
    case GemmPath::onednn_bf16_avx512:
      return "onednn_bf16_avx512";
    case GemmPath::onednn_amx:
      return "onednn_amx";
    case GemmPath::fallback:
      break;
  }
  return "fallback";
}

uint64_t gemm_path_count(GemmKernel kernel, GemmPath path) {
  return g_gemm_paths[static_cast<int>(kernel)][static_cast<int>(path)].load(std::memory_order_relaxed);
}

namespace detail {
void count_gemm_path(GemmKernel kernel, GemmPath path) {
  g_gemm_paths[static_cast<int>(kernel)][static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

#if !defined(TANDEM_WITH_ONEDNN)

bool onednn_built() { return false; }
const char* onednn_isa() { return "none"; }
GemmPath lowp_gemm_path(DType) { return GemmPath::fallback; }

namespace detail {
bool onednn_conv_forward(const Tensor&, const Tensor&, const Tensor&, const Conv2dArgs&, DType, Tensor&) {
  return false;
}
bool onednn_conv_backward_data(const Tensor&, const Tensor&, const Conv2dArgs&, DType, Tensor&) { return false; }
bool onednn_conv_backward_weights(const Tensor&, const Tensor&, const Conv2dArgs&, DType, Tensor&, Tensor*) {
  return false;
}
}  // namespace detail

#else

namespace onednn {

void sum_parts_into(std::vector<Tensor>& parts, Tensor& out) {
  Tensor& sum = parts[0];
  float* acc = sum.data<float>();
  // Memory-bound: only large sums are cut over the pool.
  cpu::detail::parallel_range(sum.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
    for (size_t p = 1; p < parts.size(); ++p) {
      if (!parts[p].defined()) continue;
      const float* src = parts[p].data<float>();
      for (int64_t i = i0; i < i1; ++i) acc[i] += src[i];
    }
  });
  const Tensor r = out.dtype() == kFloat32 ? sum : cpu::cast(sum, out.dtype());
  std::memcpy(out.raw_data(), r.raw_data(), static_cast<size_t>(r.numel() * elem_size(r.dtype())));
}

}  // namespace onednn

namespace {

using namespace onednn;

// ---- convolutions ----
memory::dims nchw_dims(const Tensor& t) { return {t.size(0), t.size(1), t.size(2), t.size(3)}; }

memory::desc user_md(const Tensor& t, Tag tag) {
  return memory::desc(t.dim() == 4 ? nchw_dims(t) : memory::dims{t.size(0)}, to_dnnl(t.dtype()), tag);
}

struct ConvGeometry {
  memory::dims x, w, y, strides, pad_l, pad_r;
};

ConvGeometry geometry(const memory::dims& x, const memory::dims& w, const memory::dims& y, const Conv2dArgs& a) {
  return {x, w, y, {a.stride_h, a.stride_w}, {a.pad_h, a.pad_w}, {a.pad_h, a.pad_w}};
}

std::string conv_key(const char* kind, const ConvGeometry& g, DType compute, DType d0, DType d1, DType d2) {
  return make_key(kind, g.x[0], g.x[1], g.x[2], g.x[3], g.w[0], g.w[2], g.w[3], g.y[2], g.y[3], g.strides[0],
                  g.strides[1], g.pad_l[0], g.pad_l[1], static_cast<int>(compute), static_cast<int>(d0),
                  static_cast<int>(d1), static_cast<int>(d2));
}

memory::desc any_md(const memory::dims& d, DType t) { return memory::desc(d, to_dnnl(t), Tag::any); }

// The forward primitive descriptor (also the hint of the backward ones).
dnnl::convolution_forward::primitive_desc forward_pd(const ConvGeometry& g, DType compute, DType y_dtype,
                                                     const memory::desc& bias,
                                                     const dnnl::primitive_attr& attr = dnnl::primitive_attr()) {
  auto d = bias.is_zero()
               ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                 dnnl::algorithm::convolution_direct, any_md(g.x, compute),
                                                 any_md(g.w, compute), any_md(g.y, y_dtype), g.strides, g.pad_l,
                                                 g.pad_r)
               : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                 dnnl::algorithm::convolution_direct, any_md(g.x, compute),
                                                 any_md(g.w, compute), bias, any_md(g.y, y_dtype), g.strides,
                                                 g.pad_l, g.pad_r);
  return dnnl::convolution_forward::primitive_desc(d, attr, engine());
}

DType of_dnnl(DnnlType t) { return t == DnnlType::bf16 ? kBFloat16 : t == DnnlType::f32 ? kFloat32 : kInt64; }

// Copies a plain NCHW buffer to a channel-blocked one or back (plain_to_blocked) with the engine's
// own transposes (kernels/cpu/block_layout.h), where the pair of layouts is NCHW and nChw16c; false
// (nothing done) otherwise.
bool engine_reorder(const memory::desc& plain, void* plain_data, const memory::desc& blocked, void* blocked_data,
                    bool plain_to_blocked) {
  const memory::dims d = plain.dims();
  if (d.size() != 4 || plain != memory::desc(d, plain.data_type(), Tag::nchw) ||
      blocked != memory::desc(d, blocked.data_type(), Tag::nChw16c)) {
    return false;
  }
  const DType pt = of_dnnl(plain.data_type()), bt = of_dnnl(blocked.data_type());
  return plain_to_blocked ? detail::to_channel_blocked16(plain_data, pt, blocked_data, bt, d[0], d[1], d[2] * d[3])
                          : detail::from_channel_blocked16(blocked_data, bt, plain_data, pt, d[0], d[1], d[2] * d[3]);
}

// The memory of layout `want` holding the user's data (layout `have` at p): the user's own memory
// when they match, else a pooled buffer (held in keep) filled by a reorder (cast included).
memory bring_in(const memory::desc& have, const void* p, const memory::desc& want, dnnl::stream& s,
                std::vector<Tensor>& keep) {
  memory user(have, engine(), const_cast<void*>(p));
  if (have == want) return user;
  memory m = pooled_memory(want, keep);
  if (!engine_reorder(have, const_cast<void*>(p), want, m.get_data_handle(), true)) {
    dnnl::reorder(user, m).execute(s, user, m);
  }
  return m;
}

// A buffer of layout `want` for a result the user receives in layout `have` at p (pooled, held in
// keep, when it is not the user's memory).
memory result_buffer(const memory::desc& have, void* p, const memory::desc& want, std::vector<Tensor>& keep) {
  return have == want ? memory(have, engine(), p) : pooled_memory(want, keep);
}

// Copies (reorders, casts) a result buffer to the user's memory when it is not that memory.
void take_out(memory& buf, const memory::desc& have, void* p, dnnl::stream& s) {
  if (buf.get_data_handle() == p) return;
  s.wait();  // the engine's copy reads buf itself
  if (engine_reorder(have, p, buf.get_desc(), buf.get_data_handle(), false)) return;
  memory user(have, engine(), p);
  dnnl::reorder(buf, user).execute(s, buf, user);
}

struct ConvForwardEntry {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
};
struct ConvBackwardDataEntry {
  dnnl::convolution_backward_data::primitive_desc pd;
  dnnl::convolution_backward_data prim;
};
struct ConvBackwardWeightsEntry {
  dnnl::convolution_backward_weights::primitive_desc pd;
  dnnl::convolution_backward_weights prim;
};

bool conv_supported(const Conv2dArgs& a, DType compute, std::initializer_list<const Tensor*> ts) {
  if (a.dilation_h != 1 || a.dilation_w != 1 || a.groups != 1) return false;
  if (to_dnnl(compute) == DnnlType::undef || compute == kFloat16) return false;
  for (const Tensor* t : ts) {
    if (t->defined() && (to_dnnl(t->dtype()) == DnnlType::undef || t->dtype() == kFloat16 || !t->is_contiguous()))
      return false;
    if (t->defined() && t->numel() == 0) return false;
  }
  return true;
}

}  // namespace

bool onednn_built() { return true; }

const char* onednn_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_sse41:
      return "sse41";
    default:
      return "other";
  }
}

GemmPath lowp_gemm_path(DType dtype) {
  if (dtype != kBFloat16) return GemmPath::fallback;
  if (has_isa(dnnl_cpu_isa_avx512_core_amx)) return GemmPath::onednn_amx;
  if (has_isa(dnnl_cpu_isa_avx512_core_bf16)) return GemmPath::onednn_bf16_avx512;
  return GemmPath::fallback;
}

namespace {

bool conv_forward_one(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args, DType compute,
                         Tensor& y) {
  dnnl::stream& s = stream_for_call();  // first: oneDNN sizes a primitive by the team it sees
  const ConvGeometry g = geometry(nchw_dims(x), nchw_dims(w), nchw_dims(y), args);
  const memory::desc bias_md = b.defined() ? user_md(b, Tag::x) : memory::desc();
  const std::string key = conv_key("conv_fwd", g, compute, x.dtype(), y.dtype(), b.defined() ? b.dtype() : compute) +
                          (b.defined() ? "b" : "");
  auto entry = cached<ConvForwardEntry>(key, [&] {
    auto pd = forward_pd(g, compute, y.dtype(), bias_md, user_scratchpad());
    if (!native_impl(pd.impl_info_str(), compute)) return std::shared_ptr<const ConvForwardEntry>();
    return std::make_shared<const ConvForwardEntry>(ConvForwardEntry{pd, dnnl::convolution_forward(pd)});
  });
  if (!entry) return false;
  const memory::desc x_md = user_md(x, Tag::nchw), w_md = user_md(w, Tag::oihw), y_md = user_md(y, Tag::nchw);
  std::vector<Tensor> keep;  // the pooled buffers, until the call ends
  memory X = bring_in(x_md, x.raw_data(), entry->pd.src_desc(), s, keep);
  memory W = bring_in(w_md, w.raw_data(), entry->pd.weights_desc(), s, keep);
  memory Y = result_buffer(y_md, y.raw_data(), entry->pd.dst_desc(), keep);
  std::unordered_map<int, memory> a{{DNNL_ARG_SRC, X}, {DNNL_ARG_WEIGHTS, W}, {DNNL_ARG_DST, Y}};
  if (b.defined()) a.emplace(DNNL_ARG_BIAS, memory(bias_md, engine(), const_cast<void*>(b.raw_data())));
  add_scratchpad(a, entry->pd.scratchpad_desc(), keep);
  entry->prim.execute(s, a);
  take_out(Y, y_md, y.raw_data(), s);
  s.wait();
  return true;
}

bool conv_backward_data_one(const Tensor& gy, const Tensor& w, const Conv2dArgs& args, DType compute,
                               Tensor& gx) {
  dnnl::stream& s = stream_for_call();  // first: oneDNN sizes a primitive by the team it sees
  const ConvGeometry g = geometry(nchw_dims(gx), nchw_dims(w), nchw_dims(gy), args);
  const std::string key = conv_key("conv_bwd_data", g, compute, gy.dtype(), gx.dtype(), w.dtype());
  auto entry = cached<ConvBackwardDataEntry>(key, [&] {
    auto hint = forward_pd(g, compute, compute, memory::desc());
    // diff_src in the compute dtype (a float32 gx receives it widened by take_out's reorder).
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, any_md(g.x, compute),
                                            any_md(g.w, compute), any_md(g.y, compute), g.strides, g.pad_l, g.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(d, user_scratchpad(), engine(), hint);
    if (!native_impl(pd.impl_info_str(), compute)) return std::shared_ptr<const ConvBackwardDataEntry>();
    return std::make_shared<const ConvBackwardDataEntry>(ConvBackwardDataEntry{pd, dnnl::convolution_backward_data(pd)});
  });
  if (!entry) return false;
  const memory::desc gy_md = user_md(gy, Tag::nchw), w_md = user_md(w, Tag::oihw), gx_md = user_md(gx, Tag::nchw);
  std::vector<Tensor> keep;  // the pooled buffers, until the call ends
  memory GY = bring_in(gy_md, gy.raw_data(), entry->pd.diff_dst_desc(), s, keep);
  memory W = bring_in(w_md, w.raw_data(), entry->pd.weights_desc(), s, keep);
  memory GX = result_buffer(gx_md, gx.raw_data(), entry->pd.diff_src_desc(), keep);
  std::unordered_map<int, memory> a{{DNNL_ARG_DIFF_DST, GY}, {DNNL_ARG_WEIGHTS, W}, {DNNL_ARG_DIFF_SRC, GX}};
  add_scratchpad(a, entry->pd.scratchpad_desc(), keep);
  entry->prim.execute(s, a);
  take_out(GX, gx_md, gx.raw_data(), s);
  s.wait();
  return true;
}

bool conv_backward_weights_one(const Tensor& gy, const Tensor& x, const Conv2dArgs& args, DType compute,
                                  Tensor& gw, Tensor* gb) {
  dnnl::stream& s = stream_for_call();  // first: oneDNN sizes a primitive by the team it sees
  const ConvGeometry g = geometry(nchw_dims(x), nchw_dims(gw), nchw_dims(gy), args);
  const memory::desc gb_md = gb ? user_md(*gb, Tag::x) : memory::desc();
  const std::string key = conv_key("conv_bwd_weights", g, compute, gy.dtype(), x.dtype(), gw.dtype()) +
                          (gb ? std::to_string(static_cast<int>(gb->dtype())) : "");
  auto entry = cached<ConvBackwardWeightsEntry>(key, [&] {
    auto hint =
        forward_pd(g, compute, compute, gb ? memory::desc({g.w[0]}, to_dnnl(compute), Tag::x) : memory::desc());
    auto d = gb ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any_md(g.x, compute),
                                                           any_md(g.w, gw.dtype()), gb_md, any_md(g.y, compute),
                                                           g.strides, g.pad_l, g.pad_r)
                : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any_md(g.x, compute),
                                                           any_md(g.w, gw.dtype()), any_md(g.y, compute), g.strides,
                                                           g.pad_l, g.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, user_scratchpad(), engine(), hint);
    if (!native_impl(pd.impl_info_str(), compute)) return std::shared_ptr<const ConvBackwardWeightsEntry>();
    return std::make_shared<const ConvBackwardWeightsEntry>(
        ConvBackwardWeightsEntry{pd, dnnl::convolution_backward_weights(pd)});
  });
  if (!entry) return false;
  const memory::desc gy_md = user_md(gy, Tag::nchw), x_md = user_md(x, Tag::nchw), gw_md = user_md(gw, Tag::oihw);
  std::vector<Tensor> keep;  // the pooled buffers, until the call ends
  memory GY = bring_in(gy_md, gy.raw_data(), entry->pd.diff_dst_desc(), s, keep);
  memory X = bring_in(x_md, x.raw_data(), entry->pd.src_desc(), s, keep);
  memory GW = result_buffer(gw_md, gw.raw_data(), entry->pd.diff_weights_desc(), keep);
  std::unordered_map<int, memory> a{{DNNL_ARG_DIFF_DST, GY}, {DNNL_ARG_SRC, X}, {DNNL_ARG_DIFF_WEIGHTS, GW}};
  if (gb) a.emplace(DNNL_ARG_DIFF_BIAS, memory(gb_md, engine(), gb->raw_data()));
  add_scratchpad(a, entry->pd.scratchpad_desc(), keep);
  entry->prim.execute(s, a);
  take_out(GW, gw_md, gw.raw_data(), s);
  s.wait();
  return true;
}


}  // namespace

namespace detail {

bool onednn_conv_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dArgs& args, DType compute,
                         Tensor& y) {
  if (!conv_supported(args, compute, {&x, &w, &b, &y})) return false;
  const int64_t per_item = y.numel() / y.size(0) * (w.numel() / w.size(0));
  return over_slices(x.size(0), slices_for(x.size(0), per_item), [&](int64_t, int64_t n0, int64_t n1) {
    Tensor ys = y.slice(0, n0, n1);
    return conv_forward_one(x.slice(0, n0, n1), w, b, args, compute, ys);
  });
}

bool onednn_conv_backward_data(const Tensor& gy, const Tensor& w, const Conv2dArgs& args, DType compute,
                               Tensor& gx) {
  if (!conv_supported(args, compute, {&gy, &w, &gx})) return false;
  const int64_t per_item = gy.numel() / gy.size(0) * (w.numel() / w.size(0));
  return over_slices(gy.size(0), slices_for(gy.size(0), per_item), [&](int64_t, int64_t n0, int64_t n1) {
    Tensor gxs = gx.slice(0, n0, n1);
    return conv_backward_data_one(gy.slice(0, n0, n1), w, args, compute, gxs);
  });
}

bool onednn_conv_backward_weights(const Tensor& gy, const Tensor& x, const Conv2dArgs& args, DType compute,
                                  Tensor& gw, Tensor* gb) {
  const Tensor none;
  if (!conv_supported(args, compute, {&gy, &x, &gw, gb ? gb : &none})) return false;
  const int64_t N = x.size(0), per_item = gy.numel() / N * (gw.numel() / gw.size(0));
  const int64_t chunks = slices_for(N, per_item);
  if (chunks == 1) return conv_backward_weights_one(gy, x, args, compute, gw, gb);
  // One f32 partial per slice of the batch, summed in slice order.
  std::vector<Tensor> pw(chunks), pb(chunks);
  const bool ok = over_slices(N, chunks, [&](int64_t c, int64_t n0, int64_t n1) {
    pw[c] = Tensor::empty(gw.shape(), kFloat32);
    if (gb) pb[c] = Tensor::empty(gb->shape(), kFloat32);
    return conv_backward_weights_one(gy.slice(0, n0, n1), x.slice(0, n0, n1), args, compute, pw[c],
                                     gb ? &pb[c] : nullptr);
  });
  if (!ok) return false;
  sum_parts_into(pw, gw);
  if (gb) sum_parts_into(pb, *gb);
  return true;
}

}  // namespace detail

#endif  // TANDEM_WITH_ONEDNN

}  // namespace tandem::kernels::cpu
