// PyTorch op fixtures for the nn tests: a safetensors file made by one of tests/fixtures/make_*.py,
// read once, and the comparison every fixture test uses. References are computed in float64 from
// float32 inputs and rounded to float32, so the tolerance covers only Tandem's float32 rounding:
// |actual - expected| <= 1e-5 + 1e-4 |expected| per element (tests/fixtures/README.md sizes it).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"

namespace tandem::testing {

class PytorchFixture {
 public:
  // file: under tests/fixtures; generator: the script that writes it (named in errors).
  PytorchFixture(const std::string& file, std::string generator)
      : file_(file), generator_(std::move(generator)),
        map_(load_safetensors(std::string(TANDEM_SOURCE_DIR "/tests/fixtures/") + file)) {}
  bool has(const std::string& name) const { return map_.count(name) > 0; }
  // A copy of tensor `name` (tests may make it require grad).
  Tensor get(const std::string& name) const {
    auto it = map_.find(name);
    TANDEM_CHECK(it != map_.end(), file_, " has no tensor '", name, "'; regenerate it with tests/fixtures/",
                 generator_);
    return it->second.clone();
  }

 private:
  std::string file_, generator_;
  TensorMap map_;
};

// Every element within 1e-5 + 1e-4 |expected|; the failure names the worst element.
inline void expect_close_to_pytorch(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined (no gradient flowed?)";
  ASSERT_EQ(shape_str(actual.shape()), shape_str(expected.shape())) << what << ": shape";
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < e.size(); ++i) {
    // NaN where PyTorch has NaN (and nowhere else); equal infinities match.
    const double ratio = std::isnan(e[i]) ? (std::isnan(a[i]) ? 0.0 : INFINITY)
                         : a[i] == e[i]    ? 0.0
                                           : std::abs(a[i] - e[i]) / (1e-5 + 1e-4 * std::abs(e[i]));
    if (!(ratio <= 1.0)) ++bad;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << e.size() << " elements outside tolerance; worst at "
                     << worst << ": got " << a[worst] << ", PyTorch " << e[worst];
}

}  // namespace tandem::testing
