// Device-neutral entry points of kernels/reduce.h: defined operand, float dtype, dimensions in
// range and distinct; then the kernel of the operand's backend (kernels/ops.h). No math here.
#include "kernels/reduce.h"

#include "core/profiler.h"
#include "core/view.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace tandem::kernels {
// A sum over every dimension takes the whole-tensor fast path (chunks summed in parallel).
Tensor sum_dims(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  profiler::Scope prof_scope("sum_dims");
  const Device device = float_operand_device("sum", x);
  const std::vector<int64_t> d = views::reduction_dims(dims, x.dim(), "sum");
  if (static_cast<int64_t>(d.size()) == x.dim()) {
    const Tensor total = TANDEM_FAST_KERNEL(device, sum)(x);
    return keepdim ? total.reshape(views::reduced_shape(x.shape(), d, true)) : total;
  }
  return TANDEM_KERNEL(device, sum_dims)(x, d, keepdim);
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t n = g.dim(), m = static_cast<int64_t>(shape.size());
  TANDEM_CHECK(n >= m, "sum_to: cannot sum ", g.str(), " to the larger shape ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < n; ++d) {
    const int64_t j = d - (n - m);
    if (j < 0) {
      dims.push_back(d);
    } else if (shape[j] == 1 && g.shape()[d] != 1) {
      dims.push_back(d);
    } else {
      TANDEM_CHECK(shape[j] == g.shape()[d], "sum_to: cannot sum ", g.str(), " to ", shape_str(shape));
    }
  }
  if (dims.empty()) return g.reshape(shape);
  return sum_dims(g, dims, /*keepdim=*/true).reshape(shape);
}

MaxResult max_dim(const Tensor& x, int64_t dim, bool keepdim) {
  profiler::Scope prof_scope("max_dim");
  const Device device = float_operand_device("max", x);
  dim = views::wrap_dim(dim, x.dim(), "max");
  if (x.dim() > 0) {
    TANDEM_CHECK(x.shape()[dim] > 0, "max: cannot reduce the empty dimension ", dim, " of ", x.str());
  }
  return TANDEM_KERNEL(device, max_dim)(x, dim, keepdim);
}

Tensor argmax_dim(const Tensor& x, int64_t dim, bool keepdim) {
  const Device device = float_operand_device("argmax", x);
  const int64_t d = views::wrap_dim(dim, x.dim(), "argmax");
  if (x.dim() != 2 || d != 1 || x.size(1) == 0) return max_dim(x, d, keepdim).indices;
  profiler::Scope prof_scope("argmax");
  const Tensor rows = TANDEM_FAST_KERNEL(device, argmax)(x);
  return keepdim ? rows.reshape({x.size(0), 1}) : rows;
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  profiler::Scope prof_scope("amax");
  const Device device = float_operand_device("amax", x);
  const auto d = views::reduction_dims(dims, x.dim(), "amax");
  for (int64_t k : d) {
    TANDEM_CHECK(x.shape()[k] > 0, "amax: cannot reduce the empty dimension ", k, " of ", x.str());
  }
  return TANDEM_KERNEL(device, amax)(x, d, keepdim);
}

// log_softmax over the rows of [N, C] takes the rows' fast path (kernels/ops.h: one pass per row, no
// [outer, len, inner] walk); the same values.
Tensor softmax_forward(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  profiler::Scope prof_scope(op);
  const Device device = float_operand_device(op, x);
  const int64_t d = views::wrap_dim(dim, x.dim(), op);
  if (log && x.dim() == 2 && d == 1) return TANDEM_FAST_KERNEL(device, log_softmax_forward)(x);
  return TANDEM_KERNEL(device, softmax_forward)(x, d, log);
}

Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  profiler::Scope prof_scope(op);
  const Device device = common_device(op, {grad, y});
  common_float_dtype(op, {grad, y});
  TANDEM_CHECK(grad.shape() == y.shape(), op, " backward: gradient ", grad.str(), " vs output ", y.str());
  const int64_t d = views::wrap_dim(dim, y.dim(), op);
  if (log && y.dim() == 2 && d == 1) return TANDEM_FAST_KERNEL(device, log_softmax_backward)(grad, y);
  return TANDEM_KERNEL(device, softmax_backward)(grad, y, d, log);
}

}  // namespace tandem::kernels
