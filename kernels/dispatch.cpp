#include "kernels/dispatch.h"

#include <algorithm>

namespace tandem::kernels {

void throw_no_cuda(const char* op) {
  TANDEM_FAIL(op, ": tensor is on a CUDA device but Tandem was built without CUDA "
              "(reconfigure with -DTANDEM_CUDA=ON)");
}

Device common_device(const char* op, std::initializer_list<Tensor> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!first) {
      first = &t;
      continue;
    }
    TANDEM_CHECK(t.device() == first->device(), op, ": expected all tensors on ", first->device().str(),
                 ", got one on ", t.device().str());
  }
  TANDEM_CHECK(first != nullptr, op, ": no tensor given");
  return first->device();
}

DType common_dtype(const char* op, std::initializer_list<Tensor> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!first) first = &t;
    TANDEM_CHECK(t.dtype() == first->dtype(), op, ": expected all tensors as ", dtype_name(first->dtype()),
                 ", got ", t.str());
  }
  TANDEM_CHECK(first != nullptr, op, ": no tensor given");
  return first->dtype();
}

double conv_gemm_flops(const Shape& out, const Tensor& weight, int gemms) {
  return 2.0 * gemms * static_cast<double>(out[0] * out[2] * out[3]) *
         static_cast<double>(weight.size(0) * weight.size(1) * weight.size(2) * weight.size(3));
}

DType common_float_dtype(const char* op, std::initializer_list<Tensor> tensors) {
  const DType d = common_dtype(op, tensors);
  const Tensor& first = *std::find_if(tensors.begin(), tensors.end(), [](const Tensor& t) { return t.defined(); });
  TANDEM_CHECK(d == kFloat32 || d == kFloat64, op, ": expected float32 or float64, got ", first.str());
  return d;
}

Device float_operand_device(const char* op, const Tensor& x) {
  TANDEM_CHECK(x.defined(), op, ": operand is undefined");
  const Device device = common_device(op, {x});
  common_float_dtype(op, {x});
  return device;
}

}  // namespace tandem::kernels
