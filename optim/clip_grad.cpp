// clip_grad_norm_ (see clip_grad.h): the host way reads each gradient's part of the norm (the
// 2-norm's sum of squares is computed on the gradient's device, other norms read the gradient) and
// accumulates in double; the device way stays on the gradients' device with kernels' ops.
#include "optim/clip_grad.h"

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/error.h"
#include "kernels/index.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"

namespace tandem::optim {
namespace {

double host_total_norm(const std::vector<Tensor>& grads, double norm_type) {
  double total = 0.0;
  if (norm_type == 2.0) {
    for (const Tensor& g : grads) {
      total += kernels::sum_dims(kernels::binary(kernels::BinaryOp::Mul, g, g), {}, false).item<double>();
    }
    return std::sqrt(total);
  }
  const bool inf = std::isinf(norm_type);
  for (const Tensor& g : grads)
    for (float v : g.to(Device::cpu()).contiguous().to_vector<float>()) {
      const double a = std::fabs(static_cast<double>(v));
      total = inf ? std::max(total, a) : total + std::pow(a, norm_type);
    }
  return inf ? total : std::pow(total, 1.0 / norm_type);
}

Tensor host_clip(const std::vector<Tensor>& grads, double max_norm, double norm_type) {
  const double total = host_total_norm(grads, norm_type);
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  // PyTorch multiplies even when the coefficient is 1 (a no-op in float32 arithmetic); skip that.
  if (coef < 1.0)
    for (const Tensor& g : grads) {
      Tensor target = g;
      target.copy_(kernels::binary(kernels::BinaryOp::Mul, g, static_cast<double>(static_cast<float>(coef))));
    }
  return Tensor::scalar(total, kFloat64);
}

Tensor device_clip(const std::vector<Tensor>& grads, double max_norm, double norm_type) {
  using kernels::BinaryOp;
  const Device device = grads[0].device();
  const DType dtype = grads[0].dtype();
  const auto constant = [&](double v) { return Tensor::full({}, v, dtype, device); };
  const bool inf = std::isinf(norm_type);
  std::vector<Tensor> parts;  // each gradient's part of the norm, [1]
  for (const Tensor& g : grads) {
    TANDEM_CHECK(g.device() == device, "clip_grad: the device way needs every gradient on one device, got ",
                 device.str(), " and ", g.device().str(), " (pass foreach=false)");
    if (g.numel() == 0) continue;  // no part of the norm, nothing to scale
    const Tensor flat = g.reshape({g.numel()});
    Tensor part;
    if (norm_type == 2.0) {
      part = kernels::sum_dims(kernels::binary(kernels::BinaryOp::Mul, flat, flat), {}, false);
    } else {
      const Tensor a = kernels::binary(BinaryOp::Maximum, flat, kernels::unary(kernels::UnaryOp::Neg, flat));
      part = inf ? kernels::amax(a, {0}, false)
                 : kernels::sum_dims(kernels::binary(BinaryOp::Pow, a, constant(norm_type)), {}, false);
    }
    parts.push_back(part.reshape({1}));
  }
  if (parts.empty()) return Tensor::zeros({}, dtype, device);
  const Tensor stacked = kernels::cat(parts, 0);  // one reduction over all of them
  Tensor total;
  if (norm_type == 2.0) {
    total = kernels::unary(kernels::UnaryOp::Sqrt, kernels::sum_dims(stacked, {}, false));
  } else if (inf) {
    total = kernels::amax(stacked, {0}, false);
  } else {
    total = kernels::binary(BinaryOp::Pow, kernels::sum_dims(stacked, {}, false), constant(1.0 / norm_type));
  }
  const Tensor coef = kernels::binary(
      BinaryOp::Minimum,
      kernels::binary(BinaryOp::Div, constant(max_norm), kernels::binary(BinaryOp::Add, total, constant(1e-6))),
      constant(1.0));
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;
    Tensor target = g;
    target.copy_(kernels::binary(BinaryOp::Mul, g, coef));
  }
  return total;
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       std::optional<bool> foreach) {
  TANDEM_CHECK(max_norm > 0, "clip_grad: max_norm must be > 0, got ", max_norm);
  TANDEM_CHECK(norm_type >= 1 || std::isinf(norm_type), "clip_grad: norm_type must be >= 1 or inf, got ", norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return Tensor::zeros({});
  bool on_one_cuda_device = grads[0].device().is_cuda();
  for (const Tensor& g : grads) on_one_cuda_device = on_one_cuda_device && g.device() == grads[0].device();
  return foreach.value_or(on_one_cuda_device) ? device_clip(grads, max_norm, norm_type)
                                              : host_clip(grads, max_norm, norm_type);
}

}  // namespace tandem::optim
