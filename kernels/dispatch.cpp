#include "kernels/dispatch.h"

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

DType common_float_dtype(const char* op, std::initializer_list<Tensor> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!first) first = &t;
    TANDEM_CHECK(t.dtype() == first->dtype(), op, ": expected all tensors as ", dtype_name(first->dtype()),
                 ", got ", t.str());
  }
  TANDEM_CHECK(first != nullptr, op, ": no tensor given");
  const DType d = first->dtype();
  TANDEM_CHECK(d == kFloat32 || (d == kFloat64 && first->device().is_cpu()), op,
               ": expected float32 (or float64 on CPU), got ", first->str());
  return d;
}

}  // namespace tandem::kernels
