// Tensor: a reference-counted handle (like torch.Tensor) to a TensorImpl that
// holds shared storage, shape, strides (in elements), offset, dtype and an
// optional autograd record. Copying a Tensor copies the handle: both names see
// the same data and the same .grad. Views (reshape, flatten, slice,
// transpose) share storage and carry no autograd history; the differentiable
// versions live in nn/functional.h. Layout is row-major (NCHW for images).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"

namespace tandem {

using Shape = std::vector<int64_t>;

class Node;
class Tensor;
struct TensorImpl;

std::string shape_str(const Shape& shape);  // "[64, 1, 28, 28]"
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

// Called with the leaf once its gradient for the current backward is final.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;        // accumulated gradient (leaves)
  std::shared_ptr<Node> grad_fn;           // producer (non-leaves)
  uint32_t output_nr = 0;                  // which output of grad_fn
  std::shared_ptr<Node> grad_accumulator;  // leaves: created on first use
  // Registration order; each with the handle register_post_accumulate_grad_hook returned.
  std::vector<std::pair<uint64_t, PostAccumulateGradHook>> post_accumulate_hooks;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::Float32;
  std::unique_ptr<AutogradMeta> autograd;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation ----
  static Tensor empty(const Shape& shape, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = kFloat32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = kFloat32,
                     Device device = Device::cpu());
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  static Tensor scalar(double value, DType dtype = kFloat32);
  // A contiguous tensor over `storage` (which must hold at least the shape's bytes), e.g. memory
  // owned elsewhere (Storage's release-function constructor).
  static Tensor from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  size_t nbytes() const { return numel() * element_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  std::string str() const;  // "float32[64, 10] on cpu"

  // ---- data access (host memory, checked dtype) ----
  template <typename T> T* data();
  template <typename T> const T* data() const;
  void* raw_data();
  const void* raw_data() const;
  template <typename T> T item() const;
  template <typename T> std::vector<T> to_vector() const;

  // ---- views: share storage, no autograd history ----
  Tensor view(const Shape& shape) const;     // contiguous only; one -1 allowed
  Tensor reshape(const Shape& shape) const;  // view if contiguous, else copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor contiguous() const;  // itself if already contiguous

  // ---- copies and conversions (no autograd history) ----
  Tensor clone() const;
  Tensor to(Device device) const;  // itself if already there
  Tensor to(DType dtype) const;    // itself if already that dtype
  Tensor& copy_(const Tensor& src);  // same shape; any dtype/device pair
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& add_(const Tensor& other, double alpha = 1.0);  // same shape and dtype: float32, float64, int64

  // ---- autograd ----
  bool requires_grad() const { return impl().autograd && impl().autograd->requires_grad; }
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const { return !grad_fn(); }
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  std::shared_ptr<Node> grad_fn() const;
  uint32_t output_nr() const;
  void set_grad_fn(std::shared_ptr<Node> fn, uint32_t output_nr);
  // Returns a handle (never 0) for remove_post_accumulate_grad_hook.
  uint64_t register_post_accumulate_grad_hook(PostAccumulateGradHook hook);
  // Removes the hook `handle` names; false if this tensor has no such hook.
  bool remove_post_accumulate_grad_hook(uint64_t handle);
  Tensor detach() const;  // shares data, no history, requires_grad false
  // Runs the autograd engine from this tensor; grad defaults to ones for a scalar.
  void backward(const Tensor& grad = Tensor()) const;
  // Replaces this handle's data/shape with other's (used by Module::to and
  // load_state_dict); keeps the autograd record.
  void set_data(const Tensor& other);

  // identity: same TensorImpl
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  AutogradMeta& autograd_meta();  // creates it on first use

 private:
  TensorImpl& impl() const;
  void check_host_dtype(DType expected) const;
  std::shared_ptr<TensorImpl> impl_;
};

// ---- template definitions ----

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  TANDEM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ",
               values.size(), " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>);
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

template <typename T>
T* Tensor::data() {
  check_host_dtype(dtype_of<T>);
  return static_cast<T*>(impl().storage->data()) + impl().offset;
}

template <typename T>
const T* Tensor::data() const {
  check_host_dtype(dtype_of<T>);
  return static_cast<const T*>(impl().storage->data()) + impl().offset;
}

template <typename T>
T Tensor::item() const {
  TANDEM_CHECK(numel() == 1, "item() needs a tensor with one element, got ", str());
  Tensor host = to(Device::cpu()).to(dtype_of<T>);
  return *host.data<T>();
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu()).to(dtype_of<T>).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

}  // namespace tandem
