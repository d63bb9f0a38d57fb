// Device-neutral entry points of kernels/attention.h: operands on the CPU, one float dtype, shapes
// consistent; then the CPU's kernel (a CPU-only op of kernels/ops.h). A CUDA operand is an error
// naming the op.
#include "kernels/attention.h"

#include "core/profiler.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

void check_operands(const Tensor& q, const Tensor& k, const Tensor& v) {
  TANDEM_CHECK(q.defined() && k.defined() && v.defined(), "fused attention: query, key and value must be defined");
  const Device device = common_device("fused attention", {q, k, v});
  TANDEM_CHECK(device.is_cpu(), "fused attention: the kernel is CPU-only, got operands on ", device.str());
  common_float_dtype("fused attention", {q, k, v});
  TANDEM_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k.size(0) == q.size(0) && v.size(0) == q.size(0) &&
                   k.size(2) == q.size(2) && v.size(1) == k.size(1) && q.size(1) > 0 && k.size(1) > 0,
               "fused attention: expected q [B, L, E], k [B, S, E], v [B, S, Ev] with L, S >= 1, got ", q.str(), ", ",
               k.str(), ", ", v.str());
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool is_causal) {
  profiler::Scope prof_scope("attention");
  check_operands(q, k, v);
  return TANDEM_KERNEL(q.device(), attention_forward)(q, k, v, scale, is_causal);
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale, bool is_causal) {
  profiler::Scope prof_scope("attention_backward");
  check_operands(q, k, v);
  common_device("fused attention backward", {q, grad_out, out, lse});
  common_float_dtype("fused attention backward", {q, grad_out, out, lse});
  const Shape want_out = {q.size(0), q.size(1), v.size(2)};
  TANDEM_CHECK(grad_out.shape() == want_out && out.shape() == want_out &&
                   lse.shape() == Shape({q.size(0), q.size(1)}),
               "fused attention backward: expected grad_out and output ", shape_str(want_out), " and lse [",
               q.size(0), ", ", q.size(1), "], got ", grad_out.str(), ", ", out.str(), ", ", lse.str());
  return TANDEM_KERNEL(q.device(), attention_backward)(grad_out, q, k, v, out, lse, scale, is_causal);
}

}  // namespace tandem::kernels
