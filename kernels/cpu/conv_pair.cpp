// CPU kernels of the conv pair (kernels/conv_pair.h) under tandem::kernels::cpu.
// Assumes: arguments validated by kernels/conv.cpp (x [N, C, H, W], main_weight [K3, C, 3, 3],
// projection_weight [K1, C, 1, 1], the gradients of the outputs' shapes or undefined).
// Guarantees: float32 where fused_here (the stride-2 direct kernels take both convs and oneDNN does not
// take the 3x3, f32_conv_pays): one pass over each image's phase planes
// (kernels/cpu/conv_strided.h's conv_strided_pair_*), the batch cut into chunks of whole images, the
// weight gradients summed per chunk and added in chunk order (deterministic for a thread count). The
// outputs and the 3x3's weight gradient are bitwise the two convs' one by one; the projection's weight
// gradient sums the same products in another grouping (per lane over the phase plane, where the 1x1 alone
// takes pairs of positions, and on more threads conv2d cuts the 1x1's smaller work into fewer chunks), so
// it agrees to rounding; x's gradient sums both convs' contributions to an even pixel in one accumulator,
// so it differs from their sum by rounding.
// Elsewhere (float64, builds without AVX-512, oneDNN's sizes): cpu::conv2d_forward and
// cpu::conv2d_backward twice, the input gradients added; in float32 where oneDNN took the 3x3, the
// projection's input gradient is added into the 3x3's in place (only its even pixels read and written,
// the same values as the addition but for a zero's sign).
#include <algorithm>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/conv_strided.h"
#include "kernels/cpu/dnnl.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {
namespace {

constexpr Conv2dArgs kMain{2, 2, 1, 1}, kProjection{2, 2, 0, 0};

detail::StridedConvShape pair_shape(const Tensor& x, const Tensor& w3) {
  const int64_t H = x.size(2), W = x.size(3);
  return {x.size(1), H, W, w3.size(0), 3, 3, 1, 1, (H - 1) / 2 + 1, (W - 1) / 2 + 1};
}

bool fused_here(const Tensor& x, const Tensor& w3, const Tensor& w1) {
  if (x.dtype() != kFloat32) return false;
  return !f32_conv_pays(x, w3, kMain) && detail::conv_strided_pair_supported(pair_shape(x, w3), w1.size(0));
}

// Where the 3x3 is not fused (oneDNN's sizes), the projection's input gradient can still go into the 3x3's
// in place: float32 and the stride-2 direct kernel's 1x1.
bool adds_in_place(const Tensor& x, const Tensor& w1) {
  return x.dtype() == kFloat32 && w1.dtype() == kFloat32 &&
         detail::conv_strided_projection(x.size(1), w1.size(0), 1, 1, 2, 2, 0, 0);
}

// Chunks of whole images, each about 2^18 multiply-adds or more (kernels/cpu/conv.cpp's grain).
int64_t pair_chunks(const detail::StridedConvShape& g, int64_t N, int64_t K1) {
  const int64_t per_image = std::max<int64_t>(1, (g.K * 9 + K1) * g.C * g.P * g.Q);
  return detail::num_chunks(N, std::max<int64_t>(1, (int64_t{1} << 18) / per_image));
}

// grad, or zeros of shape where nothing flowed to that output.
Tensor or_zeros(const Tensor& grad, const Shape& shape, DType dtype) {
  return grad.defined() ? grad.contiguous() : Tensor::zeros(shape, dtype);
}

}  // namespace

Conv2dPair conv2d_pair_forward(const Tensor& x_in, const Tensor& w3_in, const Tensor& w1_in) {
  if (!fused_here(x_in, w3_in, w1_in)) {
    detail::count_simd_path(SimdKernel::conv2d_pair_forward, SimdLevel::portable);
    return {cpu::conv2d_forward(x_in, w3_in, Tensor(), kMain), cpu::conv2d_forward(x_in, w1_in, Tensor(), kProjection)};
  }
  const Tensor x = x_in.contiguous(), w3 = w3_in.contiguous(), w1 = w1_in.contiguous();
  const detail::StridedConvShape g = pair_shape(x, w3);
  const int64_t N = x.size(0), K1 = w1.size(0);
  detail::count_gemm_path(GemmKernel::conv2d_forward, GemmPath::eigen);
  detail::count_simd_path(SimdKernel::conv2d_pair_forward, kSimdLevel);
  Conv2dPair y{Tensor::empty({N, g.K, g.P, g.Q}, kFloat32), Tensor::empty({N, K1, g.P, g.Q}, kFloat32)};
  detail::for_each_chunk(N, pair_chunks(g, N, K1), [&](int64_t, int64_t n0, int64_t n1) {
    detail::conv_strided_pair_forward(x.data<float>(), w3.data<float>(), w1.data<float>(), y.main.data<float>(),
                                      y.projection.data<float>(), n0, n1, g, K1);
  });
  return y;
}

Conv2dPairGrads conv2d_pair_backward(const Tensor& grad_main, const Tensor& grad_projection, const Tensor& x_in,
                                     const Tensor& w3_in, const Tensor& w1_in, bool need_input, bool need_main_weight,
                                     bool need_projection_weight) {
  Conv2dPairGrads out;
  if (!need_input && !need_main_weight && !need_projection_weight) return out;
  const detail::StridedConvShape g = pair_shape(x_in, w3_in);
  const int64_t N = x_in.size(0), K1 = w1_in.size(0);
  const Tensor gm = or_zeros(grad_main, {N, g.K, g.P, g.Q}, x_in.dtype());
  const Tensor gp = or_zeros(grad_projection, {N, K1, g.P, g.Q}, x_in.dtype());
  if (!fused_here(x_in, w3_in, w1_in)) {
    Conv2dGrads a = cpu::conv2d_backward(gm, x_in, w3_in, kMain, need_input, need_main_weight, false);
    const bool add_in_place = need_input && adds_in_place(x_in, w1_in);
    detail::count_simd_path(SimdKernel::conv2d_pair_backward, add_in_place ? kSimdLevel : SimdLevel::portable);
    Conv2dGrads b = cpu::conv2d_backward(gp, x_in, w1_in, kProjection, need_input && !add_in_place,
                                         need_projection_weight, false);
    if (add_in_place) {
      // The projection's input gradient straight into the 3x3's (its even pixels), no full-size pass.
      const detail::StridedConvShape g1{g.C, g.H, g.W, K1, 1, 1, 0, 0, g.P, g.Q};
      const Tensor w1 = w1_in.contiguous();
      detail::for_each_chunk(N, pair_chunks(g, N, K1), [&](int64_t, int64_t n0, int64_t n1) {
        detail::conv_strided_projection_input_grad_add(gp.data<float>(), w1.data<float>(), a.input.data<float>(), n0,
                                                       n1, g1);
      });
    } else if (need_input) {
      a.input.add_(b.input);
    }
    out.input = a.input;
    out.main_weight = a.weight;
    out.projection_weight = b.weight;
    return out;
  }
  const Tensor x = x_in.contiguous(), w3 = w3_in.contiguous(), w1 = w1_in.contiguous();
  detail::count_gemm_path(GemmKernel::conv2d_backward, GemmPath::eigen);
  detail::count_simd_path(SimdKernel::conv2d_pair_backward, kSimdLevel);
  const int64_t chunks = pair_chunks(g, N, K1);
  if (need_input) {
    out.input = Tensor::empty(x.shape(), kFloat32);
    detail::for_each_chunk(N, chunks, [&](int64_t, int64_t n0, int64_t n1) {
      detail::conv_strided_pair_input_grad(gm.data<float>(), gp.data<float>(), w3.data<float>(), w1.data<float>(),
                                           out.input.data<float>(), n0, n1, g, K1);
    });
  }
  if (need_main_weight || need_projection_weight) {
    // Both weight gradients come from the same pass; [chunk][K3 C 9 + K1 C] partial sums, added in order.
    const int64_t n3 = w3.numel(), per = n3 + w1.numel();
    std::vector<float> part(static_cast<size_t>(chunks * per), 0.0f);
    detail::for_each_chunk(N, chunks, [&](int64_t chunk, int64_t n0, int64_t n1) {
      float* p = part.data() + chunk * per;
      detail::conv_strided_pair_weight_grad(gm.data<float>(), gp.data<float>(), x.data<float>(), p, p + n3, n0, n1,
                                            g, K1);
    });
    const auto sum = [&](const Tensor& like, int64_t off) {
      Tensor t = Tensor::zeros(like.shape(), kFloat32);
      float* d = t.data<float>();
      for (int64_t c = 0; c < chunks; ++c) {
        const float* p = part.data() + c * per + off;
        for (int64_t i = 0; i < like.numel(); ++i) d[i] += p[i];
      }
      return t;
    };
    if (need_main_weight) out.main_weight = sum(w3, 0);
    if (need_projection_weight) out.projection_weight = sum(w1, n3);
  }
  return out;
}

}  // namespace tandem::kernels::cpu
