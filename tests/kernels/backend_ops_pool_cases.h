// The backend_ops cases of the pooling ops (kernels/pool.h, kernels/avg_pool.h): max_pool2d_forward
// (values and indices) and its backward, avg_pool_forward and avg_pool_backward through their entry
// points (avg_pool2d_* with kernel, stride, padding, ceil_mode, count_include_pad, divisor_override;
// adaptive_avg_pool2d_*). Each runs over plain, transposed and strided inputs, ties (the first
// maximum wins), NaN and infinities (a NaN wins its window), several geometries (padding, dilation,
// ceil_mode, adaptive windows, non-square kernels) and an empty batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops_reduce_cases.h"  // ReduceInput
#include "backend_ops_util.h"
#include "kernels/ops.h"

namespace tandem::backend_ops {

// Inputs with the view a case takes of them (ReduceInput, as the reductions' cases).
inline std::vector<ReduceInput> pool_inputs(uint64_t seed) {
  return {
      {"values", uniform({2, 3, 7, 6}, seed)},
      {"transposed", uniform({3, 2, 7, 6}, seed), transposed},
      {"strided", uniform({2, 2, 7, 12}, seed), every_other},
      {"ties", ties({2, 2, 6, 6}, seed)},
      {"specials", specials({1, 2, 6, 7})},
      {"empty_batch", uniform({0, 2, 6, 6}, seed)},
  };
}

inline void add_max_pool_cases(CaseTable& t) {
  namespace K = kernels;
  struct Geometry {
    std::string name;
    K::MaxPool2dArgs args;
  };
  K::MaxPool2dArgs k3s2p1{3, 3, 2, 2, 1, 1}, dilated{3, 3, 1, 1, 1, 1, 2, 2}, ceil{2, 2, 2, 2, 0, 0, 1, 1, true},
      wide{2, 3, 1, 2, 1, 1}, adaptive;
  adaptive.adaptive_h = 3;
  adaptive.adaptive_w = 4;
  const std::vector<Geometry> geometries = {{"k2", K::MaxPool2dArgs{}}, {"k3s2p1", k3s2p1}, {"dilation2", dilated},
                                            {"ceil_mode", ceil},        {"k2x3s1x2", wide},  {"adaptive3x4", adaptive}};
  for (const ReduceInput& in : pool_inputs(91))
    for (const Geometry& g : geometries) {
      const auto view = in.view;
      const K::MaxPool2dArgs args = g.args;
      const std::string n = in.name + "/" + g.name;
      t["max_pool2d_forward"].push_back({n, {in.x}, [view, args](const Inputs& x) {
                                           auto r = K::max_pool2d_forward(view(x[0]), args);
                                           return Inputs{r.output, r.indices};
                                         }});
      t["max_pool2d_backward"].push_back({n, {in.x}, [view, args](const Inputs& x) {
                                            const Tensor v = view(x[0]);
                                            auto r = K::max_pool2d_forward(v, args);
                                            const Tensor g = Tensor::full(r.output.shape(), 0.75, v.dtype(), v.device());
                                            return Inputs{K::max_pool2d_backward(g, r.indices, v.shape())};
                                          }});
    }
}

inline void add_avg_pool_cases(CaseTable& t) {
  namespace K = kernels;
  struct Geometry {
    std::string name;
    K::AvgPool2dArgs args;
  };
  const std::vector<Geometry> geometries = {
      {"k2", K::AvgPool2dArgs{}},
      {"k3s2p1", {3, 3, 2, 2, 1, 1}},
      {"k3s2p1_ceil_nopad", {3, 3, 2, 2, 1, 1, true, false}},
      {"k2x3s1x2_divisor5", {2, 3, 1, 2, 1, 1, false, true, 5}},
  };
  for (const ReduceInput& in : pool_inputs(93)) {
    const auto view = in.view;
    for (const Geometry& g : geometries) {
      const K::AvgPool2dArgs args = g.args;
      const std::string n = in.name + "/" + g.name;
      t["avg_pool_forward"].push_back({n, {in.x}, [view, args](const Inputs& x) {
                                         return Inputs{K::avg_pool2d_forward(view(x[0]), args)};
                                       }, 4, 9});
      t["avg_pool_backward"].push_back({n, {in.x}, [view, args](const Inputs& x) {
                                          const Tensor v = view(x[0]);
                                          const Tensor y = K::avg_pool2d_forward(v, args);
                                          const Tensor g = Tensor::full(y.shape(), 0.75, v.dtype(), v.device());
                                          return Inputs{K::avg_pool2d_backward(g, v.shape(), args)};
                                        }, 4, 9});
    }
    if (in.name == "empty_batch") continue;
    t["avg_pool_forward"].push_back({in.name + "/adaptive3x4", {in.x}, [view](const Inputs& x) {
                                       return Inputs{K::adaptive_avg_pool2d_forward(view(x[0]), 3, 4)};
                                     }, 4, 9});
    t["avg_pool_backward"].push_back({in.name + "/adaptive3x4", {in.x}, [view](const Inputs& x) {
                                        const Tensor v = view(x[0]);
                                        const Tensor g = Tensor::full({v.size(0), v.size(1), 3, 4}, 0.75, v.dtype(), v.device());
                                        return Inputs{K::adaptive_avg_pool2d_backward(g, v.shape())};
                                      }, 4, 9});
  }
}

inline void add_pool_cases(CaseTable& t) {
  add_max_pool_cases(t);
  add_avg_pool_cases(t);
}

}  // namespace tandem::backend_ops
