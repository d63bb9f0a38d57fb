// Helpers for the GPU parity tests: seeded random host tensors, a copy to cuda:0, and an
// elementwise comparison of a CUDA result with the CPU kernel's result, |got - ref| <= atol +
// rtol * |ref|, naming the first mismatching index. Every test skips when no device is visible (fails under
// TANDEM_REQUIRE_GPU=1: tests/common/require_gpu.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/random.h"
#include "core/tensor.h"
#include "common/require_gpu.h"

namespace tandem::gpu_test {

inline Device gpu() { return Device::cuda(0); }

// Uniform values in [lo, hi) on the host, float32 unless asked otherwise.
inline Tensor random_cpu(const Shape& shape, Generator& gen, double lo = -1.0, double hi = 1.0,
                         DType dtype = kFloat32) {
  std::vector<double> v(shape_numel(shape));
  for (double& x : v) x = gen.uniform(lo, hi);
  return Tensor::from_vector<double>(v, shape).to(dtype);
}

// Small integers in [0, k) as float32: many exact ties, for max/argmax tie-breaking.
inline Tensor random_ties_cpu(const Shape& shape, Generator& gen, int k) {
  std::vector<float> v(shape_numel(shape));
  for (float& x : v) x = static_cast<float>(gen.below(k));
  return Tensor::from_vector<float>(v, shape);
}

inline std::vector<double> as_doubles(const Tensor& t) {
  return t.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
}

// got: the CUDA result; ref: the CPU result. Both must be defined and of one shape.
inline ::testing::AssertionResult close(const Tensor& got, const Tensor& ref, double atol, double rtol) {
  if (!got.defined() || !ref.defined())
    return ::testing::AssertionFailure() << "undefined tensor: got " << got.str() << ", ref " << ref.str();
  if (got.shape() != ref.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " != reference "
                                         << shape_str(ref.shape());
  const std::vector<double> g = as_doubles(got), r = as_doubles(ref);
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(g[i] - r[i]);
    const bool equal = g[i] == r[i] || (std::isnan(g[i]) && std::isnan(r[i]));  // also equal infinities
    if (!equal && !(err <= atol + rtol * std::abs(r[i])))
      return ::testing::AssertionFailure() << "index " << i << ": CUDA " << g[i] << ", CPU " << r[i] << " (|diff| "
                                           << err << ", allowed " << atol + rtol * std::abs(r[i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

// Bitwise-equal values (exact kernels: relu, max pooling, casts, copies).
inline ::testing::AssertionResult same(const Tensor& got, const Tensor& ref) { return close(got, ref, 0.0, 0.0); }

template <typename Fn>
::testing::AssertionResult throws_with(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& n : needles)
      if (what.find(n) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << n << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no tandem::Error thrown";
}

}  // namespace tandem::gpu_test
