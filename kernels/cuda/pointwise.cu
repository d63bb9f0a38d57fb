// CUDA kernels of kernels/pointwise.h (float32 and float64; the dropout mask float32) under
// tandem::kernels::cuda, registered in the op table (kernels/ops.h).
// Assumes: validated by kernels/pointwise.cpp (one CUDA device, one float dtype, shapes broadcast).
// How: one thread per output element over a grid-stride loop; operands are read in place through
// their broadcast strides (kernels/cuda/strided.h), so broadcast and strided views need no
// copy; the per-element math is kernels/pointwise_math.h, the same code the CPU kernels run.
// Guarantees: fresh contiguous outputs of the broadcast shape on the operands' device; all work on
// the device's compute stream. The dropout mask is drawn from a counter-based generator
// (kernels/pointwise_math.h), not from the Generator's own sequence, so it differs from the CPU
// kernel's mask for one seed; its distribution is the same (0 with probability p, else 1 / (1 - p),
// independently per element). Captured into a cuda::Graph, the kernel reads the graph's replay
// counter from device memory, so every replay draws a new mask from that distribution.
#include <array>

#include "core/cuda/launch.cuh"
#include "core/view.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/strided.h"
#include "kernels/ops.h"
#include "kernels/pointwise_math.h"

namespace tandem::kernels::cuda {
namespace {

template <typename T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* out, StridedLayout<2> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[2];
    l.offsets(i, off);
    out[i] = math::apply_binary<T>(op, a[off[0]], b[off[1]]);
  }
}

template <typename T>
__global__ void binary_grad_kernel(BinaryOp op, int which, const T* g, const T* a, const T* b, const T* y, T* out,
                                   StridedLayout<4> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[4];
    l.offsets(i, off);
    out[i] = math::apply_binary_grad<T>(op, which, g[off[0]], a[off[1]], b[off[2]], y ? y[off[3]] : T(0));
  }
}

template <typename T>
__global__ void compare_kernel(CompareOp op, const T* a, const T* b, uint8_t* out, StridedLayout<2> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[2];
    l.offsets(i, off);
    out[i] = math::apply_compare<T>(op, a[off[0]], b[off[1]]) ? 1 : 0;
  }
}

template <typename T>
__global__ void where_kernel(const uint8_t* c, const T* a, const T* b, T* out, StridedLayout<3> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[3];
    l.offsets(i, off);
    out[i] = c[off[0]] ? a[off[1]] : b[off[2]];
  }
}

template <typename T>
__global__ void unary_kernel(UnaryOp op, const T* x, T* out, StridedLayout<1> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[1];
    l.offsets(i, off);
    out[i] = math::apply_unary<T>(op, x[off[0]]);
  }
}

template <typename T>
__global__ void unary_grad_kernel(UnaryOp op, const T* g, const T* x, const T* y, T* out, StridedLayout<3> l,
                                  int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[3];
    l.offsets(i, off);
    out[i] = math::apply_unary_grad<T>(op, g[off[0]], x[off[1]], y[off[2]]);
  }
}

// `replay`: null eagerly; under a cuda::Graph capture its replay counter, read at run time, so a
// replayed graph draws a new mask each time (math::dropout_seed).
__global__ void dropout_kernel(uint64_t draw, const uint64_t* replay, double p, float keep, float* out, int64_t n) {
  const uint64_t seed = math::dropout_seed(draw, replay);
  TANDEM_GRID_STRIDE_LOOP(i, n) { out[i] = math::dropout_value<float>(math::dropout_uniform(seed, i), p, keep); }
}

template <typename T>
const T* in_ptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  const int dev = check_f32_f64_cuda(name, {a, b});
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(a.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, binary_kernel<T>, grid_for(n), 256, 0, op, in_ptr<T>(a), in_ptr<T>(b), elem_ptr<T>(out),
           strided_layout<2>(name, shape, {a, b}), n);
  });
  return out;
}

Tensor binary_backward(BinaryOp op, int which, const Tensor& grad, const Tensor& a, const Tensor& b,
                       const Tensor& y) {
  const char* name = op_name(op);
  const int dev = check_f32_f64_cuda(name, {grad, a, b, y});
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), name);
  TANDEM_CHECK(grad.shape() == shape, name, " backward: gradient ", grad.str(), ", expected shape ", shape_str(shape));
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const Tensor y_or_g = y.defined() ? y : grad;  // a stand-in for the layout when y is not given
  StreamGuard on(dev);
  dispatch_cuda_float(a.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, binary_grad_kernel<T>, grid_for(n), 256, 0, op, which, in_ptr<T>(grad), in_ptr<T>(a), in_ptr<T>(b),
           y.defined() ? in_ptr<T>(y) : nullptr, elem_ptr<T>(out), strided_layout<4>(name, shape, {grad, a, b, y_or_g}),
           n);
  });
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  const int dev = check_f32_f64_cuda(name, {a, b});
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, kUInt8, a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(a.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, compare_kernel<T>, grid_for(n), 256, 0, op, in_ptr<T>(a), in_ptr<T>(b), elem_ptr<uint8_t>(out),
           strided_layout<2>(name, shape, {a, b}), n);
  });
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const int dev = check_f32_f64_cuda("where", {a, b});
  TANDEM_CHECK(cond.device() == a.device(), "where: condition on ", cond.device().str(), ", operands on ",
               a.device().str());
  const Shape shape =
      views::broadcast_shapes(cond.shape(), views::broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(a.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, where_kernel<T>, grid_for(n), 256, 0, in_ptr<uint8_t>(cond), in_ptr<T>(a), in_ptr<T>(b),
           elem_ptr<T>(out), strided_layout<3>("where", shape, {cond, a, b}), n);
  });
  return out;
}

Tensor unary(UnaryOp op, const Tensor& x) {
  const char* name = op_name(op);
  const int dev = check_f32_f64_cuda(name, {x});
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, unary_kernel<T>, grid_for(n), 256, 0, op, in_ptr<T>(x), elem_ptr<T>(out),
           strided_layout<1>(name, x.shape(), {x}), n);
  });
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  const char* name = op_name(op);
  const int dev = check_f32_f64_cuda(name, {grad, x, y});
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, unary_grad_kernel<T>, grid_for(n), 256, 0, op, in_ptr<T>(grad), in_ptr<T>(x), in_ptr<T>(y),
           elem_ptr<T>(out), strided_layout<3>(name, x.shape(), {grad, x, y}), n);
  });
  return out;
}

Tensor dropout_mask(const Shape& shape, double p, DType dtype, Device device, Generator& gen) {
  TANDEM_CHECK(dtype == kFloat32, "dropout: expected float32 on CUDA, got ", dtype_name(dtype));
  check_device_index(device.index);
  Tensor out = Tensor::empty(shape, kFloat32, device);
  const int64_t n = out.numel();
  const uint64_t draw = gen.next_u64();  // one draw per mask, whatever its size (at capture: one per graph)
  if (n == 0) return out;
  StreamGuard on(device.index);
  const uint64_t* replay = capture_replay_counter(device.index);
  launch(on, dropout_kernel, grid_for(n), 256, 0, draw, replay, p, static_cast<float>(1.0 / (1.0 - p)), f32_ptr(out),
         n);
  return out;
}

}  // namespace tandem::kernels::cuda
