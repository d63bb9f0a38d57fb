// Finite-difference gradient checking in float64 for the nn tests: the analytic gradient of
// sum(f(inputs) * R), R a fixed random tensor (ones for a one-element output), against central
// differences with step 1e-6, per element |analytic - numeric| <= atol + rtol |numeric|.
// Inputs must be contiguous float64 host leaves (the check perturbs their storage in place); to
// test an op on non-contiguous operands, transpose or slice inside fn. On another `device` (the
// GPU tests), fn runs on copies of the inputs there: the analytic pass on leaves copied once, each
// numeric pass on a copy of the perturbed host input.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/autograd.h"
#include "core/device.h"
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
                      std::vector<size_t> check, double atol = 1e-6, double rtol = 1e-4,
                      Device device = Device::cpu()) {
  namespace F = nn::functional;
  Generator gen(1234);
  const bool on_host = device.is_cpu();
  std::vector<Tensor> leaves = inputs;  // on the host: the inputs themselves
  if (!on_host)
    for (Tensor& t : leaves) t = t.to(device);
  for (size_t k : check) leaves[k].set_requires_grad(true);
  Tensor out = fn(leaves);
  Tensor r = out.numel() == 1 ? Tensor::ones(out.shape(), kFloat64) : random_f64(out.shape(), gen);
  r = r.to(device);
  auto objective = [&](const std::vector<Tensor>& in) { return F::sum(F::mul(fn(in), r)); };
  objective(leaves).backward();

  const double eps = 1e-6;
  for (size_t k : check) {
    Tensor analytic = leaves[k].grad();
    ASSERT_TRUE(analytic.defined()) << "no gradient for input " << k;
    ASSERT_EQ(analytic.shape(), inputs[k].shape()) << "gradient shape of input " << k;
    const std::vector<double> a = analytic.to(Device::cpu()).to_vector<double>();
    double* x = inputs[k].data<double>();
    std::vector<Tensor> in = leaves;
    const auto value = [&] {
      if (!on_host) in[k] = inputs[k].to(device);
      return objective(in).item<double>();
    };
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      const double saved = x[i];
      double plus, minus;
      {
        NoGradGuard ng;
        x[i] = saved + eps;
        plus = value();
        x[i] = saved - eps;
        minus = value();
        x[i] = saved;
      }
      const double numeric = (plus - minus) / (2 * eps);
      ASSERT_NEAR(a[i], numeric, atol + rtol * std::abs(numeric)) << "input " << k << " element " << i;
    }
  }
}

}  // namespace tandem::testing
