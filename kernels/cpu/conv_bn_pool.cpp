// CPU kernels of the fused conv2d + batch norm + relu + 2x2 max-pool (kernels/conv_bn_pool.h) under
// tandem::kernels::cpu.
// Assumes: arguments validated by kernels/batch_norm.cpp (x [N, 1, H, W] with H, W >= 4, conv_weight
// [K, 1, 3, 3], the batch norm's operands [K]).
// Guarantees: float32 where conv_c1_supported (AVX-512 builds): the conv output is never stored. Each
// pass computes the conv images it reads (kernels/cpu/conv_c1.h: 0.39 MFLOP an MNIST image, from a 3 KB
// image) into a per-thread image and runs the fused batch norm's own plane functions on it
// (kernels/cpu/conv_bn_pool.h):
// - forward: (training) the statistics, each (image, channel) row's shifted moments kept and added per
//   channel in image order, the shifts image 0's first values, then the running statistics updated;
//   then the pooling pass;
// - backward: the first pass over pooled data only (no conv); then per image the conv again, the batch
//   norm's input gradient into a second per-thread image and from there into the conv's weight and bias
//   accumulators of its chunk, the batch cut into chunks as conv2d_backward cuts it (kernels/cpu/conv.cpp
//   batch_chunks), the chunks' sums added in chunk order as conv2d_backward adds them.
//   Every value is bitwise the unfused ops' (conv2d_forward, batch_norm_relu_max_pool2d_forward, their
//   backwards) for the same thread count.
// Elsewhere (float64, builds without AVX-512): those ops one by one, the backward computing the conv
// output again from x.
#include "kernels/cpu/conv_bn_pool.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/conv_c1.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {
namespace {

bool fused_here(const Tensor& x, const Tensor& conv_weight) {
  return x.dtype() == kFloat32 && conv_weight.dtype() == kFloat32 &&
         detail::conv_c1_supported(conv_weight.size(1), conv_weight.size(2), conv_weight.size(3), 1, 1, 0, 0);
}

// The chunks conv2d_backward cuts this batch into (kernels/cpu/conv.cpp batch_chunks).
int64_t conv_chunks(int64_t N, int64_t K, int64_t P, int64_t Q) {
  const int64_t flops_per_image = std::max<int64_t>(1, K * 9 * P * Q);
  return detail::num_chunks(N, std::max<int64_t>(1, (int64_t{1} << 18) / flops_per_image));
}

// The conv of one call: x [N, 1, H, W] and its weight and bias made contiguous; image(n, buf) computes
// conv output image n [K, P, Q] into buf (a scratch(), from the caching allocator: no page faults, no
// zero fill) and returns it.
struct Conv {
  Tensor x, w, b;
  int64_t N, H, W, K, P, Q;
  Conv(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in)
      : x(x_in.contiguous()),
        w(w_in.contiguous()),
        b(b_in.defined() ? b_in.contiguous() : Tensor()),
        N(x.size(0)),
        H(x.size(2)),
        W(x.size(3)),
        K(w.size(0)),
        P(H - 2),
        Q(W - 2) {}
  Tensor scratch() const { return Tensor::empty({K * P * Q}, kFloat32); }
  const float* image(int64_t n, Tensor& buf) const {
    detail::conv_c1_forward(x.data<float>() + n * H * W, w.data<float>(), b.defined() ? b.data<float>() : nullptr,
                            buf.data<float>(), 0, 1, H, W, K, 0);
    return buf.data<float>();
  }
  detail::BnLayout layout() const { return {N, K, P * Q}; }
};

#if TANDEM_SIMD == TANDEM_SIMD_AVX512
// Training statistics as BnForwardArgs::all_channels takes them, on conv images: mean and invstd into
// mp, ip; running statistics (when rmp) updated.
void statistics(const Conv& cv, double momentum, double eps, float* mp, float* ip, float* rmp, float* rvp) {
  const detail::BnLayout l = cv.layout();
  Tensor first = cv.scratch();
  const float* image0 = cv.image(0, first);
  std::vector<float> shift(static_cast<size_t>(l.C));
  for (int64_t c = 0; c < l.C; ++c) shift[c] = image0[c * l.HW];
  Tensor row_sums = Tensor::empty({2 * l.N * l.C}, kFloat64);
  double* rows = row_sums.data<double>();
  detail::parallel_range(l.N, detail::bn_image_grain(l), [&](int64_t n0, int64_t n1) {
    Tensor buf = cv.scratch();
    for (int64_t n = n0; n < n1; ++n) {
      const float* img = cv.image(n, buf);
      for (int64_t c = 0; c < l.C; ++c) {
        double s1 = 0, s2 = 0;
        detail::row_moments(img + c * l.HW, l.HW, shift[c], s1, s2);
        rows[2 * (n * l.C + c)] = s1;
        rows[2 * (n * l.C + c) + 1] = s2;
      }
    }
  });
  for (int64_t c = 0; c < l.C; ++c) {
    double s1 = 0, s2 = 0;
    for (int64_t n = 0; n < l.N; ++n) {
      s1 += rows[2 * (n * l.C + c)];
      s2 += rows[2 * (n * l.C + c) + 1];
    }
    const auto st = detail::finish_statistics<float>(s1, s2, shift[c], l.N * l.HW, c, momentum, eps, rmp, rvp);
    mp[c] = st.mean;
    ip[c] = st.invstd;
  }
}
#else  // fused_here() is false without AVX-512: never reached
void statistics(const Conv&, double, double, float*, float*, float*, float*) {
  TANDEM_FAIL("conv_batch_norm_relu_max_pool2d: the fused statistics need an AVX-512 build");
}
#endif

BatchNormReluPoolForward fused_forward(const Conv& cv, const Tensor& weight, const Tensor& bias,
                                       const Tensor& running_mean, const Tensor& running_var, bool training,
                                       double momentum, double eps) {
  const detail::BnLayout l = cv.layout();
  const int64_t PP = cv.P / 2, QQ = cv.Q / 2, PQ = PP * QQ;
  BatchNormReluPoolForward r;
  r.output = Tensor::empty({l.N, l.C, PP, QQ}, kFloat32);
  r.code = Tensor::empty({l.N, l.C, PP, QQ}, kUInt8);
  r.winner = Tensor::empty({l.N, l.C, PP, QQ}, kFloat32);
  r.save_mean = Tensor::empty({l.C}, kFloat32);
  r.save_invstd = Tensor::empty({l.C}, kFloat32);
  const Tensor w = detail::contiguous_if_defined(weight), b = detail::contiguous_if_defined(bias);
  const float *wp = detail::data_or_null<float>(w), *bp = detail::data_or_null<float>(b);
  Tensor rm = running_mean, rv = running_var;  // updated in place in the caller's buffers
  float* rmp = rm.defined() ? rm.data<float>() : nullptr;
  float* rvp = rv.defined() ? rv.data<float>() : nullptr;
  float *mp = r.save_mean.data<float>(), *ip = r.save_invstd.data<float>();
  if (training) {
    statistics(cv, momentum, eps, mp, ip, rmp, rvp);
  } else {
    for (int64_t c = 0; c < l.C; ++c) {
      const auto st = detail::eval_statistics<float>(rmp, rvp, c, eps);
      mp[c] = st.mean;
      ip[c] = st.invstd;
    }
  }
  std::vector<detail::BnAffine<float>> affine(static_cast<size_t>(l.C));
  for (int64_t c = 0; c < l.C; ++c) affine[c] = detail::bn_affine_of<float>(ip[c], wp, bp, c, mp[c]);
  float *yp = r.output.data<float>(), *xwp = r.winner.data<float>();
  uint8_t* kp = r.code.data<uint8_t>();
  detail::parallel_range(l.N, detail::bn_image_grain(l), [&](int64_t n0, int64_t n1) {
    Tensor buf = cv.scratch();
    for (int64_t n = n0; n < n1; ++n) {
      const float* img = cv.image(n, buf);
      for (int64_t c = 0; c < l.C; ++c) {
        const int64_t o = (n * l.C + c) * PQ;
        detail::bn_pool_forward_plane(img + c * l.HW, cv.P, cv.Q, affine[c].alpha, affine[c].beta, yp + o, kp + o,
                                      xwp + o);
      }
    }
  });
  return r;
}

}  // namespace

BatchNormReluPoolForward conv_batch_norm_relu_max_pool2d_forward(const Tensor& x, const Tensor& conv_weight,
                                                                 const Tensor& conv_bias, const Tensor& weight,
                                                                 const Tensor& bias, const Tensor& running_mean,
                                                                 const Tensor& running_var, bool training,
                                                                 double momentum, double eps) {
  if (!fused_here(x, conv_weight)) {
    const Tensor y = cpu::conv2d_forward(x, conv_weight, conv_bias, Conv2dArgs{});
    return cpu::batch_norm_relu_max_pool2d_forward(y, weight, bias, running_mean, running_var, training, momentum,
                                                   eps);
  }
  detail::count_gemm_path(GemmKernel::conv2d_forward, GemmPath::eigen);
  detail::count_simd_path(SimdKernel::conv2d_forward, kSimdLevel);
  detail::count_simd_path(SimdKernel::bn_relu_pool_forward, kSimdLevel);
  return fused_forward(Conv(x, conv_weight, conv_bias), weight, bias, running_mean, running_var, training, momentum,
                       eps);
}

ConvBatchNormReluPoolGrads conv_batch_norm_relu_max_pool2d_backward(
    const Tensor& grad_out, const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,
    const BatchNormReluPoolForward& f, const Tensor& weight, const Tensor& bias, bool training, bool need_conv_weight,
    bool need_conv_bias, bool need_weight, bool need_bias) {
  const bool need_conv = need_conv_weight || need_conv_bias;
  if (!need_conv || !fused_here(x, conv_weight)) {
    const Tensor y = cpu::conv2d_forward(x, conv_weight, conv_bias, Conv2dArgs{});
    auto g = cpu::batch_norm_relu_max_pool2d_backward(grad_out, y, f.code, f.winner, weight, bias, f.save_mean,
                                                      f.save_invstd, training, need_conv, need_weight, need_bias);
    Conv2dGrads c;
    if (need_conv) {
      c = cpu::conv2d_backward(g.input, x, conv_weight, Conv2dArgs{}, false, need_conv_weight, need_conv_bias);
    }
    return {c.weight, c.bias, g.weight, g.bias};
  }
  detail::count_gemm_path(GemmKernel::conv2d_backward, GemmPath::eigen);
  detail::count_simd_path(SimdKernel::conv2d_backward, kSimdLevel);
  detail::count_simd_path(SimdKernel::bn_relu_pool_backward, kSimdLevel);
  const Conv cv(x, conv_weight, conv_bias);
  const detail::BnLayout l = cv.layout();
  const int64_t K = cv.K, PQ = (cv.P / 2) * (cv.Q / 2);
  const Tensor gy = grad_out.contiguous(), code = f.code.contiguous(), winner = f.winner.contiguous();
  const Tensor w = detail::contiguous_if_defined(weight), b = detail::contiguous_if_defined(bias);
  const Tensor mean = f.save_mean.contiguous(), invstd = f.save_invstd.contiguous();
  const float *wp = detail::data_or_null<float>(w), *mp = mean.data<float>(), *ip = invstd.data<float>();
  ConvBatchNormReluPoolGrads r;
  if (need_weight) r.weight = Tensor::empty({K}, kFloat32);
  if (need_bias) r.bias = Tensor::empty({K}, kFloat32);
  const std::vector<detail::BnAffine<float>> affine =
      detail::saved_affine_maps<float>(mp, ip, wp, detail::data_or_null<float>(b), K);
  const float *gyp = gy.data<float>(), *xwp = winner.data<float>();
  const uint8_t* kp = code.data<uint8_t>();
  const std::vector<detail::BnGradCoef<float>> coef = detail::bn_pool_grad_coefficients(
      gyp, xwp, l, PQ, affine, mp, ip, wp, training, need_weight ? r.weight.data<float>() : nullptr,
      need_bias ? r.bias.data<float>() : nullptr);
  // Per image: the conv output again, the batch norm's input gradient, the conv's weight gradient.
  const int64_t chunks = conv_chunks(cv.N, K, cv.P, cv.Q), part = detail::conv_c1_part_size(K);
  std::vector<float> parts(static_cast<size_t>(chunks * part), 0.0f);
  const float* xp = cv.x.data<float>();
  detail::for_each_chunk(cv.N, chunks, [&](int64_t chunk, int64_t n0, int64_t n1) {
    Tensor buf = cv.scratch(), gx_image = cv.scratch();
    float* gx = gx_image.data<float>();
    for (int64_t n = n0; n < n1; ++n) {
      const float* img = cv.image(n, buf);
      for (int64_t c = 0; c < K; ++c) {
        const int64_t o = (n * K + c) * PQ;
        detail::bn_pool_input_grad_plane(img + c * l.HW, xwp + o, gyp + o, kp + o, cv.P, cv.Q, affine[c], mp[c],
                                         coef[c], gx + c * l.HW, !training);
      }
      detail::conv_c1_weight_grad_image(gx, xp + n * cv.H * cv.W, parts.data() + chunk * part, cv.H, cv.W, K);
    }
  });
  if (need_conv_weight) r.conv_weight = Tensor::zeros(conv_weight.shape(), kFloat32);
  if (need_conv_bias) r.conv_bias = Tensor::zeros({K}, kFloat32);
  float* dw = need_conv_weight ? r.conv_weight.data<float>() : nullptr;
  float* db = need_conv_bias ? r.conv_bias.data<float>() : nullptr;
  // Chunk 0 into the result, the others into scratch and then added in chunk order, as conv2d_backward.
  const int64_t used = detail::used_chunks(cv.N, chunks);
  if (used > 0) detail::conv_c1_weight_grad_finish(parts.data(), dw, db, K);
  const int64_t stride = K * 9 + K;
  std::vector<float> finished(static_cast<size_t>(used * stride));
  for (int64_t c = 1; c < used; ++c) {
    float* f = finished.data() + c * stride;
    detail::conv_c1_weight_grad_finish(parts.data() + c * part, dw ? f : nullptr, db ? f + K * 9 : nullptr, K);
  }
  if (dw) detail::add_chunk_partials(dw, finished.data(), stride, K * 9, used);
  if (db) detail::add_chunk_partials(db, finished.data() + K * 9, stride, K, used);
  return r;
}

}  // namespace tandem::kernels::cpu
