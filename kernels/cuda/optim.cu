// Fused optimizer updates on CUDA: one thread per element applies the per-element functor of
// kernels/functors.h (SgdStep, AdadeltaStep, AdamStep), the same code the CPU kernels run, so
// the update math is written once. float32 tensors of one shape on one device; param and state
// are updated in place and must be contiguous, the gradient may be strided. Compute stream only.
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {
namespace {

__global__ void sgd_kernel(SgdStep step, float* p, const float* g, float* buf, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    float b = buf ? buf[i] : 0.0f;
    step(p[i], g[i], b);
    if (buf) buf[i] = b;
  }
}

__global__ void adadelta_kernel(AdadeltaStep step, float* p, const float* g, float* square_avg, float* acc_delta,
                                int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { step(p[i], g[i], square_avg[i], acc_delta[i]); }
}

__global__ void adam_kernel(AdamStep step, float* p, const float* g, float* m, float* v, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) { step(p[i], g[i], m[i], v[i]); }
}

// Checks the operands of an update and returns the device index. The gradient may be strided
// (it is read through a contiguous copy); param and state are updated in place, so they must be
// contiguous.
int check_update(const char* op, const Tensor& param, const Tensor& grad, std::initializer_list<Tensor> state) {
  TANDEM_CHECK(param.defined() && grad.defined(), op, ": param and grad must be defined");
  const int dev = check_f32_cuda(op, {param, grad});
  TANDEM_CHECK(param.is_contiguous(), op, ": param must be contiguous (it is updated in place), got ", param.str());
  TANDEM_CHECK(grad.shape() == param.shape(), op, ": grad ", grad.str(), " does not match param ", param.str());
  for (const Tensor& t : state) {
    TANDEM_CHECK(t.defined(), op, ": a state tensor of param ", param.str(), " is undefined");
    check_f32_cuda(op, {param, t});
    TANDEM_CHECK(t.shape() == param.shape(), op, ": state ", t.str(), " does not match param ", param.str());
    TANDEM_CHECK(t.is_contiguous(), op, ": state ", t.str(), " must be contiguous (it is updated in place)");
  }
  return dev;
}

}  // namespace

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& step) {
  const char* op = "sgd_update";
  const bool has_buf = step.momentum != 0.0f;
  const int dev = has_buf ? check_update(op, param, grad, {momentum_buf}) : check_update(op, param, grad, {});
  const int64_t n = param.numel();
  if (n == 0) return;
  const Tensor g = grad.contiguous();
  StreamGuard on(dev);
  launch(on, sgd_kernel, grid_for(n), 256, 0, step, f32_ptr(param), f32_ptr(g), has_buf ? f32_ptr(momentum_buf) : nullptr, n);
}

void adadelta_update(const Tensor& param, const Tensor& grad, const Tensor& square_avg, const Tensor& acc_delta,
                     const AdadeltaStep& step) {
  const int dev = check_update("adadelta_update", param, grad, {square_avg, acc_delta});
  const int64_t n = param.numel();
  if (n == 0) return;
  const Tensor g = grad.contiguous();
  StreamGuard on(dev);
  launch(on, adadelta_kernel, grid_for(n), 256, 0, step, f32_ptr(param), f32_ptr(g), f32_ptr(square_avg), f32_ptr(acc_delta), n);
}

void adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamStep& step) {
  const int dev = check_update("adam_update", param, grad, {exp_avg, exp_avg_sq});
  const int64_t n = param.numel();
  if (n == 0) return;
  const Tensor g = grad.contiguous();
  StreamGuard on(dev);
  launch(on, adam_kernel, grid_for(n), 256, 0, step, f32_ptr(param), f32_ptr(g), f32_ptr(exp_avg), f32_ptr(exp_avg_sq), n);
}

}  // namespace tandem::kernels::cuda
