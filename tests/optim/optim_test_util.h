// Test helpers for the optimizer tests: a float32 parameter and its gradient from values.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::test {

inline Tensor param(std::vector<float> v) {
  return Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size())}).set_requires_grad(true);
}

inline void set_grad(Tensor& p, std::vector<float> g) {
  p.set_grad(Tensor::from_vector<float>(g, {static_cast<int64_t>(g.size())}));
}

}  // namespace tandem::test
