// CPU kernels of the fused conv2d + batch norm + relu + 2x2 max-pool (kernels/conv_bn_pool.h) under
// tandem::kernels::cpu.
// Assumes: arguments validated by kernels/conv_bn_pool.cpp (x [N, 1, H, W], conv_weight [K, 1, 3, 3],
// the conv output at least 2x2).
// Guarantees: float32 where conv_c1_supported (AVX-512 builds): the one-channel conv kernels of
// kernels/cpu/conv_c1.h and the batch-norm kernels of kernels/cpu/batch_norm_pool.cpp, each image computed
// as those ops compute it, interleaved:
// - forward, training: the conv writes image n just before the statistics read it (the hook
//   before_image; image 0 first, whose values are the statistics' shifts); eval: the conv over the batch
//   first. Then the pooling pass as the batch norm's own.
// - backward: the batch norm's input gradient of image n goes to a per-thread scratch image and from
//   there into the conv's weight and bias accumulators of its chunk, the batch cut into chunks as
//   conv2d_backward cuts it (kernels/cpu/conv.cpp batch_chunks); the chunks' sums are added in chunk order
//   as conv2d_backward adds them. Every value is bitwise the unfused ops' for the same thread count.
// Elsewhere (float64, builds without AVX-512): conv2d_forward then batch_norm_relu_max_pool2d_forward,
// and their backwards, one by one.
#include "kernels/cpu/conv_bn_pool.h"

#include <algorithm>
#include <vector>

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

}  // namespace

ConvBatchNormReluPoolForward conv_batch_norm_relu_max_pool2d_forward(const Tensor& x_in, const Tensor& conv_weight,
                                                                     const Tensor& conv_bias, const Tensor& weight,
                                                                     const Tensor& bias, const Tensor& running_mean,
                                                                     const Tensor& running_var, bool training,
                                                                     double momentum, double eps) {
  if (!fused_here(x_in, conv_weight)) {
    Tensor y = cpu::conv2d_forward(x_in, conv_weight, conv_bias, Conv2dArgs{});
    auto pool =
        cpu::batch_norm_relu_max_pool2d_forward(y, weight, bias, running_mean, running_var, training, momentum, eps);
    return {y, pool};
  }
  const Tensor x = x_in.contiguous(), cw = conv_weight.contiguous();
  const Tensor cb = conv_bias.defined() ? conv_bias.contiguous() : Tensor();
  const int64_t N = x.size(0), H = x.size(2), W = x.size(3), K = cw.size(0);
  Tensor y = Tensor::empty({N, K, H - 2, W - 2}, kFloat32);
  detail::count_gemm_path(GemmKernel::conv2d_forward, GemmPath::eigen);
  detail::count_simd_path(SimdKernel::conv2d_forward, kSimdLevel);
  const float* xp = x.data<float>();
  const float* wp = cw.data<float>();
  const float* bp = cb.defined() ? cb.data<float>() : nullptr;
  float* yp = y.data<float>();
  auto conv = [&](int64_t n0, int64_t n1) { detail::conv_c1_forward(xp, wp, bp, yp, n0, n1, H, W, K); };
  std::function<void(int64_t)> before_image;
  if (training && N > 0) {
    conv(0, 1);
    before_image = [&](int64_t n) { conv(n, n + 1); };
  } else {
    detail::for_each_chunk(N, conv_chunks(N, K, H - 2, W - 2), [&](int64_t, int64_t n0, int64_t n1) { conv(n0, n1); });
  }
  auto pool = detail::bn_relu_pool_forward_producing(y, weight, bias, running_mean, running_var, training, momentum,
                                                     eps, before_image);
  return {y, pool};
}

ConvBatchNormReluPoolGrads conv_batch_norm_relu_max_pool2d_backward(
    const Tensor& grad_out, const Tensor& x_in, const Tensor& conv_weight, const ConvBatchNormReluPoolForward& f,
    const Tensor& weight, const Tensor& bias, bool training, bool need_conv_weight, bool need_conv_bias,
    bool need_weight, bool need_bias) {
  const bool need_conv = need_conv_weight || need_conv_bias;
  const BatchNormReluPoolForward& p = f.pool;
  if (!need_conv || !fused_here(x_in, conv_weight) || f.conv_output.dtype() != kFloat32) {
    auto g =
        cpu::batch_norm_relu_max_pool2d_backward(grad_out, f.conv_output, p.code, p.winner, weight, bias, p.save_mean,
                                                 p.save_invstd, training, need_conv, need_weight, need_bias);
    Conv2dGrads c;
    if (need_conv)
      c = cpu::conv2d_backward(g.input, x_in, conv_weight, Conv2dArgs{}, false, need_conv_weight, need_conv_bias);
    return {c.weight, c.bias, g.weight, g.bias};
  }
  const Tensor x = x_in.contiguous();
  const int64_t N = x.size(0), H = x.size(2), W = x.size(3), K = conv_weight.size(0);
  const int64_t chunks = conv_chunks(N, K, H - 2, W - 2), part = detail::conv_c1_part_size(K);
  detail::count_gemm_path(GemmKernel::conv2d_backward, GemmPath::eigen);
  detail::count_simd_path(SimdKernel::conv2d_backward, kSimdLevel);
  std::vector<float> parts(static_cast<size_t>(chunks * part), 0.0f);
  const float* xp = x.data<float>();
  const detail::ImageGradSink sink = [&](int64_t chunk, int64_t n, const float* gx) {
    detail::conv_c1_weight_grad_image(gx, xp + n * H * W, parts.data() + chunk * part, H, W, K);
  };
  auto g = detail::bn_relu_pool_backward_to_sink(grad_out, f.conv_output, p.code, p.winner, weight, bias, p.save_mean,
                                                 p.save_invstd, training, need_weight, need_bias, chunks, sink);
  ConvBatchNormReluPoolGrads r{Tensor(), Tensor(), g.weight, g.bias};
  if (need_conv_weight) r.conv_weight = Tensor::zeros(conv_weight.shape(), kFloat32);
  if (need_conv_bias) r.conv_bias = Tensor::zeros({K}, kFloat32);
  float* dw = need_conv_weight ? r.conv_weight.data<float>() : nullptr;
  float* db = need_conv_bias ? r.conv_bias.data<float>() : nullptr;
  // Chunk 0 into the result, the others from zero and then added in chunk order, as conv2d_backward.
  const int64_t step = (N + chunks - 1) / chunks, used = N > 0 ? (N + step - 1) / step : 0;
  if (used > 0) detail::conv_c1_weight_grad_finish(parts.data(), dw, db, K);
  std::vector<float> dw_c(static_cast<size_t>(K * 9)), db_c(static_cast<size_t>(K));
  for (int64_t c = 1; c < used; ++c) {
    std::fill(dw_c.begin(), dw_c.end(), 0.0f);
    std::fill(db_c.begin(), db_c.end(), 0.0f);
    detail::conv_c1_weight_grad_finish(parts.data() + c * part, dw ? dw_c.data() : nullptr, db ? db_c.data() : nullptr,
                                       K);
    for (int64_t i = 0; dw && i < K * 9; ++i) dw[i] += dw_c[i];
    for (int64_t k = 0; db && k < K; ++k) db[k] += db_c[k];
  }
  return r;
}

}  // namespace tandem::kernels::cpu
