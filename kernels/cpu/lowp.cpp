// Low-precision (bf16) linear and conv2d on oneDNN (see kernels/cpu/dnnl.h): the operands are read
// in their own dtype and the results written in it, f32 accumulation inside the primitives.
// Guarantees: linear forward y = x * w^T + b; backward gx = gy * w, gw = gy^T * x (transposes read
// in place through strides), gb = the column sums of gy summed in f32 in row order, rounded once.
// Bits: as kernels/cpu/dnnl.h says (shapes, dtypes, thread count, oneDNN's ISA).
#include "kernels/cpu/common.h"
#include "kernels/cpu/conv_strided.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/ops.h"

#include <cstring>

namespace tandem::kernels::cpu {
namespace {

// One input channel (MnistNet's first conv): the f32 one-channel kernel (kernels/cpu/conv_c1.h) on
// widened operands beats oneDNN's bf16 there (1 thread, Zen 4, [64,1,28,28] * [32,1,3,3]: forward
// ~0.36 ms against ~1.8 ms; backward even), so that case takes the fallback.
bool one_channel(const Tensor& x) { return x.size(1) == 1; }

void count_native(DType d, GemmKernel kernel) { detail::count_gemm_path(kernel, lowp_gemm_path(d)); }

float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The column sums of gy [N, O] (bf16), summed in f32 row by row, rounded to bf16 once (the same
// bits however the columns are cut).
Tensor bias_grad(const Tensor& gy) {
  const int64_t N = gy.size(0), O = gy.size(1);
  Tensor sums = Tensor::zeros({O}, kFloat32);
  float* s = sums.data<float>();
  const uint16_t* g = static_cast<const uint16_t*>(gy.raw_data());
  detail::parallel_range(O, std::max<int64_t>(16, (int64_t{1} << 14) / std::max<int64_t>(1, N)),
                         [&](int64_t o0, int64_t o1) {
                           for (int64_t n = 0; n < N; ++n) {
                             const uint16_t* row = g + n * O;
                             for (int64_t o = o0; o < o1; ++o) s[o] += bf16_to_f32(row[o]);
                           }
                         });
  return cpu::cast(sums, gy.dtype());
}

// A conv's bias gradient alone: the sums of gy [N, K, H, W] over N, H and W in f32 (gy widened first
// where it is not f32), image after image, as dtype d. A pass over gy, where oneDNN's weight primitive,
// asked for the bias, would compute the weight gradient too (its whole cost for a frozen weight).
Tensor conv_bias_grad(const Tensor& gy_in, DType d) {
  const Tensor gy = gy_in.dtype() == kFloat32 ? gy_in : cpu::cast(gy_in, kFloat32);
  const int64_t N = gy.size(0), K = gy.size(1), HW = gy.numel() / std::max<int64_t>(1, N * K);
  Tensor sums = Tensor::zeros({K}, kFloat32);
  float* s = sums.data<float>();
  const float* g = gy.data<float>();
  detail::parallel_range(K, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t n = 0; n < N; ++n) s[k] += detail::CArrMap<float>(g + (n * K + k) * HW, HW).sum();
  });
  return d == kFloat32 ? sums : cpu::cast(sums, d);
}

}  // namespace

bool lowp_linear_native(const Tensor& x) { return lowp_gemm_path(x.dtype()) != GemmPath::fallback; }

bool lowp_conv2d_native(const Tensor& x, DType d) {
  return lowp_gemm_path(d) != GemmPath::fallback && x.dim() == 4 && !one_channel(x);
}

bool lowp_linear_forward(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, Tensor& y) {
  const DType d = x_in.dtype();
  if (!lowp_linear_native(x_in)) return false;
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  Tensor out = Tensor::empty({N, O}, d);
  const detail::MatView a{x.raw_data(), d, N, I, I, 1}, wt{w.raw_data(), d, I, O, 1, I};
  if (!detail::onednn_matmul(a, wt, b, out)) {
    detail::count_gemm_path(GemmKernel::lowp_linear, GemmPath::fallback);
    return false;
  }
  count_native(d, GemmKernel::lowp_linear);
  y = out;
  return true;
}

bool lowp_linear_backward(const Tensor& gy_in, const Tensor& x_in, const Tensor& w_in, bool need_input,
                          bool need_weight, bool need_bias, LinearGrads& grads) {
  const DType d = x_in.dtype();
  if (!lowp_linear_native(x_in)) return false;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  LinearGrads g;
  if (need_input) g.input = Tensor::empty({N, I}, d);
  if (need_weight) g.weight = Tensor::empty({O, I}, d);
  const bool pair = need_input && need_weight && detail::pair_linear_gradients(N * O * I);
  const auto input_grad = [&] {
    // Paired, the bias gradient runs here too (serially: the pool is busy), beside the weight's.
    if (pair && need_bias) g.bias = bias_grad(gy);
    return detail::onednn_matmul({gy.raw_data(), d, N, O, O, 1}, {w.raw_data(), d, O, I, I, 1}, Tensor(), g.input,
                                 pair);
  };
  const auto weight_grad = [&] {
    return detail::onednn_matmul({gy.raw_data(), d, O, N, 1, O}, {x.raw_data(), d, N, I, I, 1}, Tensor(), g.weight,
                                 pair);
  };
  const bool ok = pair ? detail::run_pair(input_grad, weight_grad)
                       : (!need_input || input_grad()) && (!need_weight || weight_grad());
  if (!ok) {
    detail::count_gemm_path(GemmKernel::lowp_linear, GemmPath::fallback);
    return false;
  }
  if (need_bias && !g.bias.defined()) g.bias = bias_grad(gy);
  count_native(d, GemmKernel::lowp_linear);
  grads = g;
  return true;
}

bool lowp_conv2d_forward(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dArgs& args,
                         Tensor& y) {
  const DType d = w_in.dtype();
  if (!lowp_conv2d_native(x_in, d)) return false;
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const int64_t P = (x.size(2) + 2 * args.pad_h - w.size(2)) / args.stride_h + 1;
  const int64_t Q = (x.size(3) + 2 * args.pad_w - w.size(3)) / args.stride_w + 1;
  Tensor out = Tensor::empty({x.size(0), w.size(0), P, Q}, d);
  if (P <= 0 || Q <= 0 || !detail::onednn_conv_forward(x, w, b, args, kBFloat16, out)) {
    detail::count_gemm_path(GemmKernel::lowp_conv2d, GemmPath::fallback);
    return false;
  }
  count_native(d, GemmKernel::lowp_conv2d);
  y = out;
  return true;
}

bool lowp_conv2d_backward(const Tensor& gy_in, const Tensor& x_in, const Tensor& w_in, const Conv2dArgs& args,
                          bool need_input, bool need_weight, bool need_bias, Conv2dGrads& grads) {
  const DType d = w_in.dtype();
  if (!lowp_conv2d_native(x_in, d)) return false;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous(), w = w_in.contiguous();
  Conv2dGrads g;
  bool input_ok = true, weight_ok = true;
  if (need_input) {
    g.input = Tensor::empty(x.shape(), x.dtype());  // computed in d, widened in oneDNN's output reorder
    input_ok = detail::onednn_conv_backward_data(gy, w, args, kBFloat16, g.input);
  }
  if (need_weight) {
    Tensor gw = Tensor::empty(w.shape(), d);
    Tensor gb = need_bias ? Tensor::empty({w.size(0)}, d) : Tensor();
    weight_ok = detail::onednn_conv_backward_weights(gy, x, args, kBFloat16, gw, need_bias ? &gb : nullptr);
    g.weight = gw;
    if (need_bias) g.bias = gb;
  } else if (need_bias) {
    g.bias = conv_bias_grad(gy, d);
  }
  if (!input_ok || !weight_ok) {
    // The part oneDNN has no native kernel for: f32 math on the widened operands, rounded once.
    const Conv2dGrads r = cpu::conv2d_backward(cpu::cast(gy, kFloat32), cpu::cast(cpu::cast(x, d), kFloat32),
                                               cpu::cast(w, kFloat32), args, need_input && !input_ok,
                                               need_weight && !weight_ok, need_bias && !weight_ok);
    if (!input_ok) g.input = cpu::cast(cpu::cast(r.input, d), x.dtype());
    if (!weight_ok && need_weight) g.weight = cpu::cast(r.weight, d);
    if (!weight_ok && need_bias) g.bias = cpu::cast(r.bias, d);
  }
  detail::count_gemm_path(GemmKernel::lowp_conv2d, input_ok && weight_ok ? lowp_gemm_path(d) : GemmPath::fallback);
  grads = g;
  return true;
}

// Not the stride-2 1x1 projections the engine's direct kernel takes (kernels/cpu/conv_strided.h):
// it runs them faster than oneDNN with its reorders (bench/PERF_NOTES.md section 18).
bool f32_conv_pays(const Tensor& x, const Tensor& w, const Conv2dArgs& a) {
  if (!onednn_built() || x.dim() != 4 || w.dim() != 4 || x.dtype() != kFloat32 || x.size(1) < 16 || w.size(0) < 16) {
    return false;
  }
  return !detail::conv_strided_projection(x.size(1), w.size(0), w.size(2), w.size(3), a.stride_h, a.stride_w,
                                          a.pad_h, a.pad_w);
}

bool f32_conv2d_forward(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dArgs& args,
                        Tensor& y) {
  if (!f32_conv_pays(x_in, w_in, args)) return false;
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const int64_t P = (x.size(2) + 2 * args.pad_h - w.size(2)) / args.stride_h + 1;
  const int64_t Q = (x.size(3) + 2 * args.pad_w - w.size(3)) / args.stride_w + 1;
  if (P <= 0 || Q <= 0) return false;
  Tensor out = Tensor::empty({x.size(0), w.size(0), P, Q}, kFloat32);
  if (!detail::onednn_conv_forward(x, w, b, args, kFloat32, out)) return false;
  detail::count_gemm_path(GemmKernel::conv2d_forward, GemmPath::onednn_f32);
  y = out;
  return true;
}

bool f32_conv2d_backward(const Tensor& gy_in, const Tensor& x_in, const Tensor& w_in, const Conv2dArgs& args,
                         bool need_input, bool need_weight, bool need_bias, Conv2dGrads& grads) {
  if (!f32_conv_pays(x_in, w_in, args) || (!need_input && !need_weight && !need_bias)) return false;
  const Tensor gy = gy_in.contiguous(), x = x_in.contiguous(), w = w_in.contiguous();
  if (gy.numel() == 0) return false;
  Conv2dGrads g;
  if (need_input) {
    g.input = Tensor::empty(x.shape(), kFloat32);
    if (!detail::onednn_conv_backward_data(gy, w, args, kFloat32, g.input)) return false;
  }
  if (need_weight) {
    Tensor gw = Tensor::empty(w.shape(), kFloat32);
    Tensor gb = need_bias ? Tensor::empty({w.size(0)}, kFloat32) : Tensor();
    if (!detail::onednn_conv_backward_weights(gy, x, args, kFloat32, gw, need_bias ? &gb : nullptr)) return false;
    g.weight = gw;
    if (need_bias) g.bias = gb;
  } else if (need_bias) {
    g.bias = conv_bias_grad(gy, kFloat32);
  }
  detail::count_gemm_path(GemmKernel::conv2d_backward, GemmPath::onednn_f32);
  grads = g;
  return true;
}

}  // namespace tandem::kernels::cpu
