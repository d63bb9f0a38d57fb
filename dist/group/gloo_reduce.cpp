// ProcessGroupGloo's host-side arithmetic (see gloo_reduce.h).
#include "dist/group/gloo_reduce.h"

#include <Eigen/Core>
#include <cstring>

#include "core/error.h"

namespace tandem::dist::gloo_detail {
namespace {

template <typename T>
struct Acc {
  using type = T;
};
template <>
struct Acc<Eigen::half> {
  using type = float;
};
template <>
struct Acc<Eigen::bfloat16> {
  using type = float;
};

struct SumOp {
  template <typename A>
  static A apply(A x, A y) {
    return x + y;
  }
};
struct MaxOp {
  template <typename A>
  static A apply(A x, A y) {
    return x < y ? y : x;
  }
};
struct MinOp {
  template <typename A>
  static A apply(A x, A y) {
    return y < x ? y : x;
  }
};

template <typename T, typename Op>
void reduce_elements(void* c, const void* a, const void* b, size_t n) {
  using A = typename Acc<T>::type;
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = T(Op::apply(static_cast<A>(x[i]), static_cast<A>(y[i])));
}

template <typename T>
ReduceFn reduce_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return &reduce_elements<T, SumOp>;
    case ReduceOp::Max: return &reduce_elements<T, MaxOp>;
    case ReduceOp::Min: return &reduce_elements<T, MinOp>;
  }
  TANDEM_FAIL("unknown ReduceOp ", static_cast<int>(op));
}

template <typename T>
void divide(void* data, size_t n, int ranks) {
  using A = typename Acc<T>::type;
  T* x = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) x[i] = T(static_cast<A>(x[i]) / static_cast<A>(ranks));
}

}  // namespace

ReduceFn reduce_function(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Float32: return reduce_for<float>(op);
    case DType::Float64: return reduce_for<double>(op);
    case DType::Float16: return reduce_for<Eigen::half>(op);
    case DType::BFloat16: return reduce_for<Eigen::bfloat16>(op);
    case DType::Int64: return reduce_for<int64_t>(op);
    case DType::Int32: return reduce_for<int32_t>(op);
    case DType::UInt8: return reduce_for<uint8_t>(op);
  }
  TANDEM_FAIL("ProcessGroupGloo: cannot reduce dtype ", dtype_name(dtype));
}

void divide_in_place(void* data, size_t n, DType dtype, int ranks) {
  switch (dtype) {
    case DType::Float32: return divide<float>(data, n, ranks);
    case DType::Float64: return divide<double>(data, n, ranks);
    case DType::Float16: return divide<Eigen::half>(data, n, ranks);
    case DType::BFloat16: return divide<Eigen::bfloat16>(data, n, ranks);
    default: TANDEM_FAIL("ProcessGroupGloo: ReduceOp::Avg on ", dtype_name(dtype), " (floating point only)");
  }
}

void reduce_in_rank_order(void* out, const unsigned char* chunks, size_t stride, size_t n, int ranks,
                          const ReduceFn& fn, size_t elem_size) {
  if (ranks == 1) {
    if (out != chunks) std::memcpy(out, chunks, n * elem_size);
    return;
  }
  fn(out, chunks, chunks + stride, n);
  for (int q = 2; q < ranks; ++q) fn(out, out, chunks + static_cast<size_t>(q) * stride, n);
}

Tensor stage(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }

void unstage(Tensor& t, const Tensor& host) {
  if (!host.is_same(t)) t.copy_(host);
}

std::string where(const Tensor& t) { return t.device().is_cpu() ? "" : " on " + t.device().str() + " via host"; }

}  // namespace tandem::dist::gloo_detail
