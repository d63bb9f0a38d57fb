// The case type and helpers of the backend_ops tests (tests/kernels/backend_ops_test.cpp on the
// CPU, tests/gpu/backend_ops_test.cpp on CUDA). A case holds float64 inputs whose values are
// float32 values (so every dtype starts from the same numbers), uint8/int64 inputs as they are,
// and a run function calling the op's entry point on inputs converted to one dtype and device;
// run may take views (transposes, strided slices, expands) of them first. Outputs are compared
// NaN-aware: NaN against NaN, an infinity exactly, an integer output exactly, a finite value within
// ulps float32 roundings (2^-24) of max(|ref|, magnitude).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "core/view.h"

namespace tandem::backend_ops {

using Inputs = std::vector<Tensor>;
using Run = std::function<std::vector<Tensor>(const Inputs&)>;

struct OpCase {
  std::string name;
  Inputs inputs;
  Run run;
  double ulps = 4;        // allowed error, in float32 roundings of max(|ref|, magnitude)
  double magnitude = 1;   // the error's scale near zero (sums: the number of terms)
};
using Cases = std::vector<OpCase>;
using CaseTable = std::map<std::string, Cases>;  // op name (kernels/ops.h) -> its cases

constexpr double kRounding = 0x1p-24;  // float32's unit roundoff
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline double as_f32(double v) { return static_cast<double>(static_cast<float>(v)); }

// Uniform values in [lo, hi), rounded to float32, as float64.
inline Tensor uniform(const Shape& shape, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  Generator gen(seed);
  std::vector<double> v(shape_numel(shape));
  for (double& x : v) x = as_f32(gen.uniform(lo, hi));
  return Tensor::from_vector<double>(v, shape);
}

// Integers in [0, k) as float64: many exact ties.
inline Tensor ties(const Shape& shape, uint64_t seed, int k = 3) {
  Generator gen(seed);
  std::vector<double> v(shape_numel(shape));
  for (double& x : v) x = static_cast<double>(gen.below(k));
  return Tensor::from_vector<double>(v, shape);
}

// NaN, the infinities, both zeros and a few finite values, cycled over `shape`.
inline Tensor specials(const Shape& shape, int shift = 0) {
  static const double kValues[] = {kNaN, kInf, -kInf, 0.0, -0.0, 1.0, -1.5, 0.25, 3.0};
  std::vector<double> v(shape_numel(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = kValues[(i + shift) % 9];
  return Tensor::from_vector<double>(v, shape);
}

inline Tensor values(const std::vector<double>& v, const Shape& shape) {
  return Tensor::from_vector<double>(v, shape);
}

// A uint8 mask of 0/1.
inline Tensor mask(const Shape& shape, uint64_t seed) { return ties(shape, seed, 2).to(kUInt8); }

// The views the cases take of an input.
inline Tensor transposed(const Tensor& t) { return t.transpose(0, 1); }
inline Tensor every_other(const Tensor& t) { return t.slice(t.dim() - 1, 0, t.size(t.dim() - 1), 2); }
inline Tensor expanded(const Tensor& t, const Shape& shape) { return views::expand(t, shape); }

// The case's inputs for one run: float64 ones as `dtype`, all on `device`.
inline Inputs prepare(const Inputs& in, DType dtype, Device device) {
  Inputs out;
  for (const Tensor& t : in) out.push_back((t.dtype() == kFloat64 ? t.to(dtype) : t).to(device));
  return out;
}

inline ::testing::AssertionResult agree(const Tensor& got, const Tensor& ref, double ulps, double magnitude) {
  // Defined, of one shape, both floating or of one dtype.
  const bool floating = ref.defined() && is_floating(ref.dtype());
  const bool comparable = got.defined() && ref.defined() && got.shape() == ref.shape() &&
                          floating == is_floating(got.dtype()) && (floating || got.dtype() == ref.dtype());
  if (!comparable) return ::testing::AssertionFailure() << "output " << got.str() << ", reference " << ref.str();
  const std::vector<double> g = got.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
  const std::vector<double> r = ref.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(r[i])) continue;
    const bool exact = !floating || !std::isfinite(g[i]) || !std::isfinite(r[i]);
    const double allowed = exact ? 0.0 : ulps * kRounding * std::max(std::abs(r[i]), magnitude);
    if (g[i] != r[i] && !(std::abs(g[i] - r[i]) <= allowed))
      return ::testing::AssertionFailure() << "index " << i << ": " << g[i] << ", reference " << r[i]
                                           << " (allowed |diff| " << allowed << ")";
  }
  return ::testing::AssertionSuccess();
}

// Runs each case of `cases` on (dtype, device) and on (ref_dtype, ref_device), comparing outputs;
// ulps_scale widens every case's tolerance (CUDA's math library against the CPU's).
inline void expect_cases_agree(const Cases& cases, DType dtype, Device device, DType ref_dtype,
                               Device ref_device, double ulps_scale) {
  ASSERT_FALSE(cases.empty());
  for (const OpCase& c : cases) {
    SCOPED_TRACE("case " + c.name);
    const std::vector<Tensor> got = c.run(prepare(c.inputs, dtype, device));
    const std::vector<Tensor> ref = c.run(prepare(c.inputs, ref_dtype, ref_device));
    ASSERT_FALSE(ref.empty());
    ASSERT_EQ(got.size(), ref.size());
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE(agree(got[k], ref[k], c.ulps * ulps_scale, c.magnitude)) << "output " << k;
      EXPECT_EQ(got[k].device(), device) << "output " << k;
      if (is_floating(got[k].dtype())) {
        EXPECT_EQ(got[k].dtype(), dtype) << "output " << k;
      }
    }
  }
}

// The ops `registered` lists that `cases` has no (non-empty) list for.
inline std::vector<std::string> ops_without_cases(const std::vector<const char*>& registered, const CaseTable& cases) {
  std::vector<std::string> missing;
  for (const char* op : registered) {
    const auto it = cases.find(op);
    if (it == cases.end() || it->second.empty()) missing.push_back(op);
  }
  return missing;
}

}  // namespace tandem::backend_ops
