// Device-neutral entry points of kernels/scan.h: defined operands on one device, float dtype,
// dimension in range (wrapped; a 0-D tensor's dimension is 0 or -1); then the kernel of their
// backend (kernels/ops.h). No math.
#include "kernels/scan.h"

#include "core/profiler.h"
#include "core/view.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

int64_t wrapped(const Tensor& x, int64_t dim, const char* op) { return views::wrap_dim(dim, x.dim(), op); }

}  // namespace

Tensor prod_dim(const Tensor& x, int64_t dim, bool keepdim) {
  profiler::Scope prof_scope("prod");
  const Device device = float_operand_device("prod", x);
  return TANDEM_KERNEL(device, prod_dim)(x, wrapped(x, dim, "prod"), keepdim);
}

Tensor prod_dim_backward(const Tensor& grad, const Tensor& x, int64_t dim) {
  profiler::Scope prof_scope("prod_backward");
  const Device device = common_device("prod backward", {grad, x});
  common_float_dtype("prod backward", {grad, x});
  dim = wrapped(x, dim, "prod");
  const Shape kept = x.dim() == 0 ? Shape{} : views::reduced_shape(x.shape(), {dim}, true);
  TANDEM_CHECK(grad.shape() == kept, "prod backward: gradient ", grad.str(), ", expected shape ", shape_str(kept));
  return TANDEM_KERNEL(device, prod_dim_backward)(grad, x, dim);
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  profiler::Scope prof_scope("argsort");
  const Device device = float_operand_device("argsort", x);
  return TANDEM_KERNEL(device, argsort)(x, wrapped(x, dim, "argsort"), descending);
}

Tensor cumsum(const Tensor& x, int64_t dim, bool reverse) {
  profiler::Scope prof_scope("cumsum");
  const Device device = float_operand_device("cumsum", x);
  return TANDEM_KERNEL(device, cumsum)(x, wrapped(x, dim, "cumsum"), reverse);
}

}  // namespace tandem::kernels
