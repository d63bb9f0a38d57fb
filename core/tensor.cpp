#include "core/tensor.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <sstream>

#include "core/autograd.h"
#include "core/cuda/memory.h"
#include "core/thread_pool.h"

namespace tandem {

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

namespace {

int64_t wrap_dim(int64_t d, int64_t ndim, const char* what) {
  const int64_t w = d < 0 ? d + ndim : d;
  TANDEM_CHECK(w >= 0 && w < std::max<int64_t>(ndim, 1), what, ": dimension ", d,
               " out of range for a ", ndim, "-D tensor");
  return w;
}

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

template <typename T>
double load_as_double(const void* p) {
  return static_cast<double>(*static_cast<const T*>(p));
}
template <typename T>
void store_from_double(void* p, double v) {
  *static_cast<T*>(p) = static_cast<T>(v);
}

double load(DType t, const void* p) {
  switch (t) {
    case DType::Float32: return load_as_double<float>(p);
    case DType::Float64: return load_as_double<double>(p);
    case DType::Float16: return static_cast<double>(static_cast<float>(*static_cast<const Eigen::half*>(p)));
    case DType::BFloat16: return static_cast<double>(static_cast<float>(*static_cast<const Eigen::bfloat16*>(p)));
    case DType::Int64: return load_as_double<int64_t>(p);
    case DType::Int32: return load_as_double<int32_t>(p);
    case DType::UInt8: return load_as_double<uint8_t>(p);
  }
  return 0;
}

void store(DType t, void* p, double v) {
  switch (t) {
    case DType::Float32: return store_from_double<float>(p, v);
    case DType::Float64: return store_from_double<double>(p, v);
    case DType::Float16: *static_cast<Eigen::half*>(p) = Eigen::half(static_cast<float>(v)); return;
    case DType::BFloat16: *static_cast<Eigen::bfloat16*>(p) = Eigen::bfloat16(static_cast<float>(v)); return;
    case DType::Int64: return store_from_double<int64_t>(p, v);
    case DType::Int32: return store_from_double<int32_t>(p, v);
    case DType::UInt8: return store_from_double<uint8_t>(p, v);
  }
}

// Visits every element of a (possibly strided) tensor in row-major order,
// calling fn(byte offset of the element from storage start).
template <typename Fn>
void for_each_offset(const Tensor& t, Fn&& fn) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const size_t es = element_size(t.dtype());
  if (t.is_contiguous()) {
    for (int64_t i = 0; i < n; ++i) fn((t.offset() + i) * es);
    return;
  }
  const int64_t nd = t.dim();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = t.offset();
  for (int64_t i = 0; i < n; ++i) {
    fn(off * es);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < t.shape()[d]) {
        off += t.strides()[d];
        break;
      }
      off -= t.strides()[d] * (t.shape()[d] - 1);
      idx[d] = 0;
    }
  }
}

// Same-dtype copy between strided layouts as raw elements of type U (the dtype's size): the
// innermost dimension is a tight loop, the outer index advances both offsets incrementally.
template <typename U>
void strided_copy(Tensor& dst, const Tensor& src) {
  constexpr int64_t kInlineRow = 256 / sizeof(U);
  const int64_t nd = dst.dim(), inner = dst.shape()[nd - 1];
  const int64_t ds = dst.strides()[nd - 1], ss = src.strides()[nd - 1];
  U* d = static_cast<U*>(dst.storage()->data()) + dst.offset();
  const U* s = static_cast<const U*>(src.storage()->data()) + src.offset();
  const int64_t rows = dst.numel() / inner;
  // Local copies of the outer sizes and strides: the odometer below reads them once a row.
  const std::vector<int64_t> shape(dst.shape().begin(), dst.shape().end());
  const std::vector<int64_t> dstr(dst.strides().begin(), dst.strides().end());
  const std::vector<int64_t> sstr(src.strides().begin(), src.strides().end());
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t doff = 0, soff = 0;
  for (int64_t r = 0; r < rows; ++r) {
    U* dp = d + doff;
    const U* sp = s + soff;
    if (ds == 1 && ss == 1 && inner <= kInlineRow) {  // short rows (a head's 16-64 values): no call per row
      for (int64_t i = 0; i < inner; ++i) dp[i] = sp[i];
    } else if (ds == 1 && ss == 1) {
      std::memcpy(dp, sp, static_cast<size_t>(inner) * sizeof(U));
    } else {
      for (int64_t i = 0; i < inner; ++i) dp[i * ds] = sp[i * ss];
    }
    for (int64_t k = nd - 2; k >= 0; --k) {
      if (++idx[k] < shape[k]) {
        doff += dstr[k], soff += sstr[k];
        break;
      }
      doff -= dstr[k] * (shape[k] - 1), soff -= sstr[k] * (shape[k] - 1);
      idx[k] = 0;
    }
  }
}

void cpu_copy(Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  if (dst.dtype() == src.dtype() && dst.numel() > 0 && dst.dim() > 0) {
    switch (element_size(dst.dtype())) {
      case 1: return strided_copy<uint8_t>(dst, src);
      case 2: return strided_copy<uint16_t>(dst, src);
      case 4: return strided_copy<uint32_t>(dst, src);
      case 8: return strided_copy<uint64_t>(dst, src);
      default: break;
    }
  }
  // Gather source offsets, then scatter converted values: two passes keep the
  // element visitor simple; this path is for casts, not hot loops.
  std::vector<int64_t> src_offsets;
  src_offsets.reserve(src.numel());
  for_each_offset(src, [&](int64_t o) { src_offsets.push_back(o); });
  const char* sbase = static_cast<const char*>(src.storage()->data());
  char* dbase = static_cast<char*>(dst.storage()->data());
  size_t k = 0;
  const DType st = src.dtype(), dt = dst.dtype();
  for_each_offset(dst, [&](int64_t o) { store(dt, dbase + o, load(st, sbase + src_offsets[k++])); });
}

}  // namespace

// ---- creation ----

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  int64_t nonzero = 1;  // the product of the non-zero sizes, kept small enough for byte counts and strides
  for (int64_t s : shape) {
    TANDEM_CHECK(s >= 0, "negative size in shape ", shape_str(shape));
    TANDEM_CHECK(s == 0 || nonzero <= INT64_MAX / 16 / s, "shape ", shape_str(shape), " is too large");
    if (s) nonzero *= s;
  }
  return from_storage(std::make_shared<Storage>(shape_numel(shape) * element_size(dtype), device), shape,
                      dtype);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  const size_t needed = static_cast<size_t>(shape_numel(shape)) * element_size(dtype);
  TANDEM_CHECK(storage != nullptr && storage->nbytes() >= needed, "Tensor::from_storage: a storage of ",
               storage ? storage->nbytes() : 0, " bytes is too small for ", dtype_name(dtype), shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, device).fill_(0.0);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, device).fill_(1.0);
}
Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  return empty(shape, dtype, device).fill_(value);
}
Tensor Tensor::scalar(double value, DType dtype) { return full({}, value, dtype); }

// ---- metadata ----

TensorImpl& Tensor::impl() const {
  TANDEM_CHECK(impl_ != nullptr, "use of an undefined tensor");
  return *impl_;
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " on " + device().str();
}

void Tensor::check_host_dtype(DType expected) const {
  TANDEM_CHECK(dtype() == expected, "data<", dtype_name(expected), ">() on a ", str());
  TANDEM_CHECK(device().is_cpu(), "host data access on a ", str(), "; copy it with .to(Device::cpu())");
}

void* Tensor::raw_data() {
  return static_cast<char*>(impl().storage->data()) + offset() * element_size(dtype());
}
const void* Tensor::raw_data() const {
  return static_cast<const char*>(impl().storage->data()) + offset() * element_size(dtype());
}

// ---- views ----

Tensor Tensor::view(const Shape& shape_in) const {
  Shape shape = shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TANDEM_CHECK(infer < 0, "view: only one dimension may be -1 in ", shape_str(shape_in));
      infer = static_cast<int64_t>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    TANDEM_CHECK(known > 0 && numel() % known == 0, "view: cannot reshape ", str(), " to ",
                 shape_str(shape_in));
    shape[infer] = numel() / known;
  }
  TANDEM_CHECK(shape_numel(shape) == numel(), "view: cannot reshape ", str(), " to ", shape_str(shape_in));
  TANDEM_CHECK(is_contiguous(), "view: ", str(), " is not contiguous; use reshape()");
  return make_view(*this, shape, contiguous_strides(shape), offset());
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  TANDEM_CHECK(s <= e, "flatten: start_dim ", start_dim, " after end_dim ", end_dim);
  Shape out(shape().begin(), shape().begin() + s);
  int64_t m = 1;
  for (int64_t d = s; d <= e; ++d) m *= shape()[d];
  out.push_back(m);
  out.insert(out.end(), shape().begin() + e + 1, shape().end());
  return reshape(out);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  TANDEM_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = shape(), st = strides();
  sh[d] = (end - start + step - 1) / step;
  st[d] *= step;
  return make_view(*this, sh, st, offset() + start * strides()[d]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  TANDEM_CHECK(index >= -shape()[d] && index < shape()[d], "select: index ", index,
               " out of range for size ", shape()[d]);
  if (index < 0) index += shape()[d];
  Shape sh = shape(), st = strides();
  const int64_t off = offset() + index * st[d];
  sh.erase(sh.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, sh, st, off);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape sh = shape(), st = strides();
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

// ---- copies ----

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device d) const {
  if (device() == d) return *this;
  Tensor out = empty(shape(), dtype(), d);
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType t) const {
  if (dtype() == t) return *this;
  Tensor out = empty(shape(), t, device());
  out.copy_(*this);
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  TANDEM_CHECK(shape() == src.shape(), "copy_: shape ", shape_str(src.shape()), " into ",
               shape_str(shape()));
  if (device().is_cpu() && src.device().is_cpu()) {
    cpu_copy(*this, src);
  } else {
    cuda_detail::copy(*this, src);
  }
  return *this;
}

Tensor& Tensor::fill_(double value) {
  if (device().is_cuda()) {
    cuda_detail::fill(*this, value);
    return *this;
  }
  if (is_contiguous()) {
    const int64_t n = numel();
    switch (dtype()) {
      case DType::Float32: std::fill_n(data<float>(), n, static_cast<float>(value)); return *this;
      case DType::Float64: std::fill_n(data<double>(), n, value); return *this;
      default: break;
    }
  }
  char* base = static_cast<char*>(storage()->data());
  const DType t = dtype();
  for_each_offset(*this, [&](int64_t o) { store(t, base + o, value); });
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  TANDEM_CHECK(shape() == other.shape() && dtype() == other.dtype() && device() == other.device(),
               "add_: ", other.str(), " into ", str());
  TANDEM_CHECK(dtype() != kInt64 || alpha == static_cast<double>(static_cast<int64_t>(alpha)),
               "add_: alpha must be a whole number for int64 tensors, got ", alpha);
  if (device().is_cuda()) {
    cuda_detail::add_(*this, other, alpha);
    return *this;
  }
  TANDEM_CHECK(is_contiguous(), "add_: destination must be contiguous, got ", str());
  Tensor src = other.contiguous();
  const int64_t n = numel();
  // Float tensors of 2^16 elements or more in contiguous slices over the kernel pool, as the elementwise
  // kernels split them (autograd accumulates gradients here: at 2 threads, a tensor one core wrote whole
  // was read at half speed by the next op's other thread); elementwise, so the bits do not depend on it.
  constexpr int64_t kGrain = int64_t{1} << 16;
  auto float_add = [&](auto* d, const auto* o) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(o)>>;
    using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
    const T a = static_cast<T>(alpha);
    parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
      Eigen::Map<Arr>(d + b, e - b) += a * Eigen::Map<const Arr>(o + b, e - b);
    });
  };
  if (dtype() == kFloat32) {
    float_add(data<float>(), src.data<float>());
  } else if (dtype() == kFloat64) {
    float_add(data<double>(), src.data<double>());
  } else if (dtype() == kBFloat16 || dtype() == kFloat16) {
    // Half gradients accumulating (FSDP's mixed precision): float math, one rounding, as PyTorch's CPU add.
    auto half_add = [&](auto* d, const auto* s) {
      using T = std::remove_pointer_t<decltype(d)>;
      const float a = static_cast<float>(alpha);
      for (int64_t i = 0; i < n; ++i) d[i] = T(static_cast<float>(d[i]) + a * static_cast<float>(s[i]));
    };
    if (dtype() == kBFloat16)
      half_add(static_cast<Eigen::bfloat16*>(raw_data()), static_cast<const Eigen::bfloat16*>(src.raw_data()));
    else
      half_add(static_cast<Eigen::half*>(raw_data()), static_cast<const Eigen::half*>(src.raw_data()));
  } else if (dtype() == kInt64) {  // counters (BatchNorm's num_batches_tracked)
    using ArrayXl = Eigen::Array<int64_t, Eigen::Dynamic, 1>;
    Eigen::Map<ArrayXl> d(data<int64_t>(), n);
    d += static_cast<int64_t>(alpha) * Eigen::Map<const ArrayXl>(src.data<int64_t>(), n);
  } else {
    TANDEM_FAIL("add_: unsupported dtype ", dtype_name(dtype()), " (float32, float64, float16, bfloat16 or int64 expected)");
  }
  return *this;
}

// ---- autograd ----

AutogradMeta& Tensor::autograd_meta() {
  if (!impl().autograd) impl().autograd = std::make_unique<AutogradMeta>();
  return *impl().autograd;
}

Tensor& Tensor::set_requires_grad(bool value) {
  if (value) {
    TANDEM_CHECK(is_floating(dtype()), "requires_grad needs a floating tensor, got ", str());
    TANDEM_CHECK(is_leaf(), "requires_grad can only be set on leaf tensors");
  }
  if (value || impl().autograd) autograd_meta().requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const {
  if (!impl().autograd || !impl().autograd->grad) return Tensor();
  return Tensor(impl().autograd->grad);
}

void Tensor::set_grad(const Tensor& grad) { autograd_meta().grad = grad.impl_; }

std::shared_ptr<Node> Tensor::grad_fn() const {
  return impl().autograd ? impl().autograd->grad_fn : nullptr;
}

uint32_t Tensor::output_nr() const { return impl().autograd ? impl().autograd->output_nr : 0; }

void Tensor::set_grad_fn(std::shared_ptr<Node> fn, uint32_t nr) {
  auto& m = autograd_meta();
  m.grad_fn = std::move(fn);
  m.output_nr = nr;
  m.requires_grad = m.grad_fn != nullptr;
}

uint64_t Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) {
  TANDEM_CHECK(is_leaf() && requires_grad(),
               "post-accumulate-grad hooks go on leaf tensors that require grad");
  static std::atomic<uint64_t> next_handle{1};
  const uint64_t handle = next_handle.fetch_add(1, std::memory_order_relaxed);
  autograd_meta().post_accumulate_hooks.emplace_back(handle, std::move(hook));
  return handle;
}

bool Tensor::remove_post_accumulate_grad_hook(uint64_t handle) {
  if (!defined() || !impl().autograd) return false;
  auto& hooks = impl().autograd->post_accumulate_hooks;
  const auto it = std::find_if(hooks.begin(), hooks.end(), [&](const auto& h) { return h.first == handle; });
  if (it == hooks.end()) return false;
  hooks.erase(it);
  return true;
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }

void Tensor::backward(const Tensor& grad) const { autograd::backward({*this}, {grad}); }

void Tensor::set_data(const Tensor& other) {
  impl().storage = other.storage();
  impl().shape = other.shape();
  impl().strides = other.strides();
  impl().offset = other.offset();
  impl().dtype = other.dtype();
}

}  // namespace tandem
