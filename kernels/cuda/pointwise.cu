// CUDA kernels of kernels/pointwise.h (float32) under tandem::kernels::cuda,
// registered in the op table (kernels/ops.h).
// Assumes: validated by kernels/pointwise.cpp (one CUDA device, float32, shapes broadcast).
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

__global__ void binary_kernel(BinaryOp op, const float* a, const float* b, float* out, StridedLayout<2> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[2];
    l.offsets(i, off);
    out[i] = math::apply_binary<float>(op, a[off[0]], b[off[1]]);
  }
}

__global__ void binary_grad_kernel(BinaryOp op, int which, const float* g, const float* a, const float* b,
                                   const float* y, float* out, StridedLayout<4> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[4];
    l.offsets(i, off);
    out[i] = math::apply_binary_grad<float>(op, which, g[off[0]], a[off[1]], b[off[2]], y ? y[off[3]] : 0.0f);
  }
}

__global__ void compare_kernel(CompareOp op, const float* a, const float* b, uint8_t* out, StridedLayout<2> l,
                               int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[2];
    l.offsets(i, off);
    out[i] = math::apply_compare<float>(op, a[off[0]], b[off[1]]) ? 1 : 0;
  }
}

__global__ void where_kernel(const uint8_t* c, const float* a, const float* b, float* out, StridedLayout<3> l,
                             int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[3];
    l.offsets(i, off);
    out[i] = c[off[0]] ? a[off[1]] : b[off[2]];
  }
}

__global__ void unary_kernel(UnaryOp op, const float* x, float* out, StridedLayout<1> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[1];
    l.offsets(i, off);
    out[i] = math::apply_unary<float>(op, x[off[0]]);
  }
}

__global__ void unary_grad_kernel(UnaryOp op, const float* g, const float* x, const float* y, float* out,
                                  StridedLayout<3> l, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    int64_t off[3];
    l.offsets(i, off);
    out[i] = math::apply_unary_grad<float>(op, g[off[0]], x[off[1]], y[off[2]]);
  }
}

// `replay`: null eagerly; under a cuda::Graph capture its replay counter, read at run time, so a
// replayed graph draws a new mask each time (math::dropout_seed).
__global__ void dropout_kernel(uint64_t draw, const uint64_t* replay, double p, float keep, float* out, int64_t n) {
  const uint64_t seed = math::dropout_seed(draw, replay);
  TANDEM_GRID_STRIDE_LOOP(i, n) { out[i] = math::dropout_value<float>(math::dropout_uniform(seed, i), p, keep); }
}

const float* in_ptr(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  const int dev = check_f32_cuda(name, {a, b});
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, kFloat32, a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  launch(on, binary_kernel, grid_for(n), 256, 0, op, in_ptr(a), in_ptr(b), f32_ptr(out),
         strided_layout<2>(name, shape, {a, b}), n);
  return out;
}

Tensor binary_backward(BinaryOp op, int which, const Tensor& grad, const Tensor& a, const Tensor& b,
                       const Tensor& y) {
  const char* name = op_name(op);
  const int dev = check_f32_cuda(name, {grad, a, b, y});
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), name);
  TANDEM_CHECK(grad.shape() == shape, name, " backward: gradient ", grad.str(), ", expected shape ", shape_str(shape));
  Tensor out = Tensor::empty(shape, kFloat32, a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const Tensor y_or_g = y.defined() ? y : grad;  // a stand-in for the layout when y is not given
  StreamGuard on(dev);
  launch(on, binary_grad_kernel, grid_for(n), 256, 0, op, which, in_ptr(grad), in_ptr(a), in_ptr(b),
         y.defined() ? in_ptr(y) : nullptr, f32_ptr(out), strided_layout<4>(name, shape, {grad, a, b, y_or_g}), n);
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  const int dev = check_f32_cuda(name, {a, b});
  const Shape shape = views::broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, kUInt8, a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  launch(on, compare_kernel, grid_for(n), 256, 0, op, in_ptr(a), in_ptr(b), static_cast<uint8_t*>(out.raw_data()),
         strided_layout<2>(name, shape, {a, b}), n);
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const int dev = check_f32_cuda("where", {a, b});
  TANDEM_CHECK(cond.device() == a.device(), "where: condition on ", cond.device().str(), ", operands on ",
               a.device().str());
  const Shape shape =
      views::broadcast_shapes(cond.shape(), views::broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  Tensor out = Tensor::empty(shape, kFloat32, a.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  launch(on, where_kernel, grid_for(n), 256, 0, static_cast<const uint8_t*>(cond.raw_data()), in_ptr(a), in_ptr(b),
         f32_ptr(out), strided_layout<3>("where", shape, {cond, a, b}), n);
  return out;
}

Tensor unary(UnaryOp op, const Tensor& x) {
  const char* name = op_name(op);
  const int dev = check_f32_cuda(name, {x});
  Tensor out = Tensor::empty(x.shape(), kFloat32, x.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  launch(on, unary_kernel, grid_for(n), 256, 0, op, in_ptr(x), f32_ptr(out), strided_layout<1>(name, x.shape(), {x}),
         n);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  const char* name = op_name(op);
  const int dev = check_f32_cuda(name, {grad, x, y});
  Tensor out = Tensor::empty(x.shape(), kFloat32, x.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  StreamGuard on(dev);
  launch(on, unary_grad_kernel, grid_for(n), 256, 0, op, in_ptr(grad), in_ptr(x), in_ptr(y), f32_ptr(out),
         strided_layout<3>(name, x.shape(), {grad, x, y}), n);
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
