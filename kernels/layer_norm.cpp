// Device-neutral entry points of kernels/layer_norm.h: operands on one device, one float dtype,
// sizes consistent; then cpu:: or cuda:: by that device.
#include "kernels/layer_norm.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {

LayerNormForward layer_norm_forward(const Tensor& x, int64_t norm_size, const Tensor& weight, const Tensor& bias,
                                    double eps) {
  profiler::Scope prof_scope("layer_norm");
  TANDEM_CHECK(x.defined(), "layer_norm: input is undefined");
  const Device device = common_device("layer_norm", {x, weight, bias});
  common_float_dtype("layer_norm", {x, weight, bias});
  TANDEM_CHECK(norm_size > 0 && x.numel() % norm_size == 0, "layer_norm: ", norm_size,
               " normalized elements do not divide the input ", x.str());
  for (const Tensor* t : {&weight, &bias}) {
    TANDEM_CHECK(!t->defined() || t->numel() == norm_size, "layer_norm: weight and bias need ", norm_size,
                 " elements, got ", t->str());
  }
  return TANDEM_KERNEL(device, layer_norm_forward)(x, norm_size, weight, bias, eps);
}

LayerNormGrads layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, bool need_input, bool need_weight, bool need_bias) {
  profiler::Scope prof_scope("layer_norm_backward");
  const Device device = common_device("layer_norm", {g, x, mean, rstd, weight});
  common_float_dtype("layer_norm", {g, x, mean, rstd, weight});
  TANDEM_CHECK(g.shape() == x.shape(), "layer_norm backward: gradient ", g.str(), " does not match the input ",
               x.str());
  return TANDEM_KERNEL(device, layer_norm_backward)(g, x, mean, rstd, weight, need_input, need_weight, need_bias);
}

}  // namespace tandem::kernels
