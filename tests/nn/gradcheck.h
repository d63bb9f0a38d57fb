// Finite-difference gradient checking in float64 for the nn tests: the analytic gradient of
// sum(f(inputs) * R), R a fixed random tensor (ones for a one-element output), against central
// differences with step 1e-6, per element |analytic - numeric| <= atol + rtol |numeric|.
// Inputs must be contiguous float64 leaves (the check perturbs their storage in place); to test
// an op on non-contiguous operands, transpose or slice inside fn.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/autograd.h"
#include "core/random.h"
#include "nn/functional.h"

namespace tandem::testing {

inline Tensor random_f64(const Shape& shape, Generator& gen, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(shape, kFloat64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = gen.uniform(lo, hi);
  return t;
}

// Checks d/d(inputs[k]) of sum(fn(inputs) * R) for each k in `check`.
inline void gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, std::vector<Tensor> inputs,
                      std::vector<size_t> check, double atol = 1e-6, double rtol = 1e-4) {
  namespace F = nn::functional;
  Generator gen(1234);
  for (size_t k : check) inputs[k].set_requires_grad(true);
  Tensor out = fn(inputs);
  Tensor r = out.numel() == 1 ? Tensor::ones(out.shape(), kFloat64) : random_f64(out.shape(), gen);
  auto objective = [&](const std::vector<Tensor>& in) { return F::sum(F::mul(fn(in), r)); };
  objective(inputs).backward();

  const double eps = 1e-6;
  for (size_t k : check) {
    Tensor analytic = inputs[k].grad();
    ASSERT_TRUE(analytic.defined()) << "no gradient for input " << k;
    ASSERT_EQ(analytic.shape(), inputs[k].shape()) << "gradient shape of input " << k;
    const std::vector<double> a = analytic.to_vector<double>();
    double* x = inputs[k].data<double>();
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      const double saved = x[i];
      double plus, minus;
      {
        NoGradGuard ng;
        x[i] = saved + eps;
        plus = objective(inputs).item<double>();
        x[i] = saved - eps;
        minus = objective(inputs).item<double>();
        x[i] = saved;
      }
      const double numeric = (plus - minus) / (2 * eps);
      ASSERT_NEAR(a[i], numeric, atol + rtol * std::abs(numeric)) << "input " << k << " element " << i;
    }
  }
}

}  // namespace tandem::testing
