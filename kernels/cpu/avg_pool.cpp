// CPU kernel of kernels/avg_pool.h: averages over one rectangle window per output position, and
// its backward. Assumes: validated by kernels/avg_pool.cpp; x [N, C, H, W] may be strided (it is
// made contiguous). Guarantees: fresh contiguous outputs; windows summed in double; planes
// (n, c) processed in parallel, each plane by one thread (the backward's overlapping windows never
// race).
#include "kernels/ops.h"

#include "kernels/cpu/common.h"

namespace tandem::kernels::cpu {

Tensor avg_pool_forward(const Tensor& x_in, const PoolGeometry& win) {
  const Tensor x = x_in.contiguous();
  const int64_t planes = x.size(0) * x.size(1), H = x.size(2), W = x.size(3);
  return detail::dispatch_float(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::empty({x.size(0), x.size(1), win.out_h, win.out_w}, x.dtype());
    const T* p = x.data<T>();
    T* o = out.data<T>();
    detail::parallel_range(planes, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const T* plane = p + c * H * W;
        T* op = o + c * win.out_h * win.out_w;
        for (int64_t i = 0; i < win.out_h; ++i)
          for (int64_t j = 0; j < win.out_w; ++j) {
            int64_t h0, h1, w0, w1;
            double div;
            win.window(i, j, h0, h1, w0, w1, div);
            double s = 0;
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) s += static_cast<double>(plane[h * W + w]);
            op[i * win.out_w + j] = T(s / div);
          }
      }
    });
    return out;
  });
}

Tensor avg_pool_backward(const Tensor& g_in, const Shape& input_shape, const PoolGeometry& win) {
  const Tensor g = g_in.contiguous();
  const int64_t planes = input_shape[0] * input_shape[1], H = input_shape[2], W = input_shape[3];
  return detail::dispatch_float(g.dtype(), "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    Tensor out = Tensor::zeros(input_shape, g.dtype());
    const T* gp = g.data<T>();
    T* o = out.data<T>();
    detail::parallel_range(planes, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        T* plane = o + c * H * W;
        const T* gpl = gp + c * win.out_h * win.out_w;
        for (int64_t i = 0; i < win.out_h; ++i)
          for (int64_t j = 0; j < win.out_w; ++j) {
            int64_t h0, h1, w0, w1;
            double div;
            win.window(i, j, h0, h1, w0, w1, div);
            const T share = T(static_cast<double>(gpl[i * win.out_w + j]) / div);
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) plane[h * W + w] += share;
          }
      }
    });
    return out;
  });
}

}  // namespace tandem::kernels::cpu
