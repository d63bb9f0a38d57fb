// Helpers for the kernel tests: seeded random tensors, reading any float
// tensor as doubles, and an elementwise comparison with tolerance
// atol + rtol*|ref| that names the first mismatching index. References are
// computed in double with plain loops in each test file.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem::test {

inline Tensor random_tensor(const Shape& shape, DType dtype, Generator& gen, double lo = -1.0,
                            double hi = 1.0) {
  std::vector<double> v(shape_numel(shape));
  for (double& x : v) x = gen.uniform(lo, hi);
  return Tensor::from_vector<double>(v, shape).to(dtype);
}

inline std::vector<double> values(const Tensor& t) { return t.to(kFloat64).to_vector<double>(); }

// Tolerances by dtype: float32 kernels against a double reference.
struct Tol {
  double atol, rtol;
};
inline Tol tol_for(DType dtype) { return dtype == kFloat64 ? Tol{1e-10, 1e-10} : Tol{1e-4, 1e-4}; }

inline ::testing::AssertionResult all_close(const Tensor& got, const std::vector<double>& ref, Tol tol) {
  if (!got.defined()) return ::testing::AssertionFailure() << "tensor is undefined";
  const std::vector<double> g = values(got);
  if (g.size() != ref.size()) {
    return ::testing::AssertionFailure() << "size " << g.size() << " != reference size " << ref.size();
  }
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(g[i] - ref[i]);
    if (!(err <= tol.atol + tol.rtol * std::abs(ref[i]))) {
      return ::testing::AssertionFailure()
             << "index " << i << ": got " << g[i] << ", expected " << ref[i] << " (|diff| " << err << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Whether a and b are both defined and hold the same shape, dtype and bytes.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A non-contiguous tensor with the values of t: t is stored transposed in
// its last two dimensions and viewed back.
inline Tensor non_contiguous(const Tensor& t) {
  const int64_t d = t.dim();
  Tensor stored = t.transpose(d - 2, d - 1).contiguous();
  Tensor view = stored.transpose(d - 2, d - 1);
  EXPECT_FALSE(view.is_contiguous());
  return view;
}

// Restores the thread count after a test changes it.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadCountGuard() { set_num_threads(saved_); }

 private:
  int saved_;
};

// Expects fn() to throw tandem::Error whose message contains every needle.
template <typename Fn>
::testing::AssertionResult throws_with(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& n : needles) {
      if (what.find(n) == std::string::npos) {
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << n << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no tandem::Error thrown";
}

}  // namespace tandem::test
