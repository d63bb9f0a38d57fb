// The backend_ops cases of the reductions and scans of the table (kernels/ops.h): sum, argmax,
// sum_dims, max_dim, amax, softmax_forward/backward, prod_dim, prod_dim_backward, cumsum, argsort. Each runs
// over several dimensions (negative ones included), keepdim both ways, transposed and strided
// inputs, size-1 and empty dimensions, 0-D tensors, NaN and infinities, and exact ties for the
// maxima (the first maximum wins, NaN counting as the maximum).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops_util.h"
#include "kernels/ops.h"

namespace tandem::backend_ops {

// A reduction's inputs: float64 values, the view taken of them, and a name.
struct ReduceInput {
  std::string name;
  Tensor x;
  Tensor (*view)(const Tensor&) = [](const Tensor& t) { return t; };
};

inline std::vector<ReduceInput> reduce_inputs(uint64_t seed) {
  return {
      {"values", uniform({2, 3, 4}, seed)},
      {"transposed", uniform({4, 2, 3}, seed), transposed},
      {"strided", uniform({2, 3, 8}, seed), every_other},
      {"size_one_dims", uniform({2, 1, 4}, seed)},
      {"ties", ties({2, 3, 4}, seed)},
      {"specials", specials({2, 3, 4})},
      {"large", uniform({3, 1500, 2}, seed)},
  };
}

// Dimension lists of a 3-D input (empty: all of them).
inline std::vector<std::vector<int64_t>> dim_lists() { return {{}, {0}, {-1}, {1}, {0, 2}, {2, 0, 1}}; }

inline std::string dims_name(const std::vector<int64_t>& dims, bool keepdim) {
  std::string s = "dims";
  for (int64_t d : dims) s += "_" + std::to_string(d);
  return s + (keepdim ? "_keepdim" : "");
}

inline void add_sum_and_argmax_cases(CaseTable& t) {
  namespace K = kernels;
  const Run sum = [](const Inputs& in) { return Inputs{K::sum_dims(in[0], {}, false)}; };
  const Run sum_t = [](const Inputs& in) { return Inputs{K::sum_dims(transposed(in[0]), {}, false)}; };
  t["sum"] = {{"values", {uniform({3, 4}, 1)}, sum, 4, 12},   {"transposed", {uniform({5, 7}, 2)}, sum_t, 4, 35},
              {"large", {uniform({5000}, 3)}, sum, 4, 5000}, {"empty", {uniform({0, 3}, 4)}, sum},
              {"zero_dim", {uniform({}, 5)}, sum},            {"specials", {specials({9})}, sum},
              {"infinities", {values({kInf, 1.0, 2.0}, {3})}, sum}};
  const Run argmax = [](const Inputs& in) { return Inputs{K::argmax_dim(in[0], 1, false)}; };
  t["argmax"] = {{"values", {uniform({4, 5}, 6)}, argmax},
                 {"ties", {ties({6, 5}, 7)}, argmax},
                 {"nan_wins", {specials({3, 6})}, argmax},
                 {"one_column", {uniform({3, 1}, 8)}, argmax},
                 {"empty_rows", {uniform({0, 4}, 9)}, argmax},
                 {"transposed", {ties({5, 4}, 10)},
                  [](const Inputs& in) { return Inputs{K::argmax_dim(transposed(in[0]), 1, false)}; }}};
}

inline void add_sum_dims_and_amax_cases(CaseTable& t) {
  namespace K = kernels;
  for (const ReduceInput& r : reduce_inputs(41)) {
    for (const auto& dims : dim_lists()) {
      for (bool keepdim : {false, true}) {
        const auto view = r.view;
        const std::string n = r.name + "/" + dims_name(dims, keepdim);
        const double terms = static_cast<double>(r.x.numel());
        t["sum_dims"].push_back({n, {r.x}, [view, dims, keepdim](const Inputs& in) {
                                   return Inputs{K::sum_dims(view(in[0]), dims, keepdim)};
                                 }, 4, terms});
        t["amax"].push_back({n, {r.x}, [view, dims, keepdim](const Inputs& in) {
                               return Inputs{K::amax(view(in[0]), dims, keepdim)};
                             }, 0});
      }
    }
  }
  const auto sum_dims = [](std::vector<int64_t> dims, bool keepdim) {
    return Run([dims, keepdim](const Inputs& in) { return Inputs{K::sum_dims(in[0], dims, keepdim)}; });
  };
  const auto amax = [](std::vector<int64_t> dims, bool keepdim) {
    return Run([dims, keepdim](const Inputs& in) { return Inputs{K::amax(in[0], dims, keepdim)}; });
  };
  t["sum_dims"].push_back({"empty_reduced", {uniform({0, 3}, 1)}, sum_dims({0}, false)});
  t["sum_dims"].push_back({"empty_kept", {uniform({0, 3}, 1)}, sum_dims({1}, true)});
  t["sum_dims"].push_back({"zero_dim", {uniform({}, 2)}, sum_dims({}, false)});
  t["sum_dims"].push_back({"zero_dim_keepdim", {uniform({}, 2)}, sum_dims({}, true)});
  t["amax"].push_back({"empty_kept", {uniform({0, 3}, 1)}, amax({1}, false), 0});
  t["amax"].push_back({"zero_dim", {uniform({}, 3)}, amax({}, false), 0});
}

inline void add_max_dim_cases(CaseTable& t) {
  namespace K = kernels;
  for (const ReduceInput& r : reduce_inputs(51)) {
    for (int64_t dim : {0, 1, -1}) {
      for (bool keepdim : {false, true}) {
        const auto view = r.view;
        t["max_dim"].push_back({r.name + "/" + dims_name({dim}, keepdim), {r.x}, [view, dim, keepdim](const Inputs& in) {
                                  const K::MaxResult m = K::max_dim(view(in[0]), dim, keepdim);
                                  return Inputs{m.values, m.indices};
                                }, 0});
      }
    }
  }
  t["max_dim"].push_back({"zero_dim", {uniform({}, 4)}, [](const Inputs& in) {
                            const K::MaxResult m = K::max_dim(in[0], 0, false);
                            return Inputs{m.values, m.indices};
                          }, 0});
  t["max_dim"].push_back({"empty_kept", {uniform({0, 3}, 4)}, [](const Inputs& in) {
                            const K::MaxResult m = K::max_dim(in[0], 1, true);
                            return Inputs{m.values, m.indices};
                          }, 0});
}

inline void add_softmax_cases(CaseTable& t) {
  namespace K = kernels;
  std::vector<ReduceInput> inputs = reduce_inputs(61);
  inputs.push_back({"masked", values({1.0, -kInf, 2.0, -kInf, -kInf, 0.5, 3.0, -1.0}, {2, 4})});
  inputs.push_back({"empty", uniform({0, 4}, 62)});
  for (const ReduceInput& r : inputs) {
    for (int64_t dim : {0, -1}) {
      for (bool log : {false, true}) {
        const auto view = r.view;
        const std::string n = r.name + (log ? "/log_dim_" : "/dim_") + std::to_string(dim);
        t["softmax_forward"].push_back({n, {r.x}, [view, dim, log](const Inputs& in) {
                                          return Inputs{K::softmax_forward(view(in[0]), dim, log)};
                                        }, 8});
        t["softmax_backward"].push_back({n, {r.x, uniform(r.x.shape(), 63)}, [view, dim, log](const Inputs& in) {
                                           const Tensor y = K::softmax_forward(view(in[0]), dim, log);
                                           return Inputs{K::softmax_backward(view(in[1]), y, dim, log)};
                                         }, 16, 4});
      }
    }
  }
  t["softmax_forward"].push_back({"zero_dim", {uniform({}, 64)}, [](const Inputs& in) {
                                    return Inputs{K::softmax_forward(in[0], 0, false), K::softmax_forward(in[0], -1, true)};
                                  }});
}

// argsort's positions compare exactly: ties (stable order), NaN, infinities and signed zeros included.
inline void add_argsort_cases(CaseTable& t) {
  namespace K = kernels;
  std::vector<ReduceInput> inputs = reduce_inputs(81);
  inputs.push_back({"empty_dim", uniform({3, 0, 2}, 82)});
  for (const ReduceInput& r : inputs)
    for (int64_t dim : {0, 1, -1})
      for (bool descending : {false, true}) {
        const auto view = r.view;
        t["argsort"].push_back({r.name + "/dim_" + std::to_string(dim) + (descending ? "_descending" : ""), {r.x},
                                [view, dim, descending](const Inputs& in) {
                                  return Inputs{K::argsort(view(in[0]), dim, descending)};
                                }});
      }
  t["argsort"].push_back({"zero_dim", {uniform({}, 83)}, [](const Inputs& in) { return Inputs{K::argsort(in[0], -1, true)}; }});
}

inline void add_scan_cases(CaseTable& t) {
  namespace K = kernels;
  std::vector<ReduceInput> inputs = reduce_inputs(71);
  inputs.push_back({"near_one", uniform({3, 5, 2}, 72, 0.5, 1.5)});
  inputs.push_back({"one_zero", values({1.5, 0.0, 2.0, -3.0, 0.5, 0.0, 0.0, 2.0}, {2, 4})});
  inputs.push_back({"empty_dim", uniform({3, 0, 2}, 73)});
  for (const ReduceInput& r : inputs) {
    for (int64_t dim : {0, 1, -1}) {
      const auto view = r.view;
      const std::string n = r.name + "/dim_" + std::to_string(dim);
      const double terms = static_cast<double>(r.x.numel());
      for (bool reverse : {false, true}) {
        t["cumsum"].push_back({n + (reverse ? "_reverse" : ""), {r.x}, [view, dim, reverse](const Inputs& in) {
                                 return Inputs{K::cumsum(view(in[0]), dim, reverse)};
                               }, 4, terms});
      }
      if (r.name == "large") continue;  // a product of 1500 values leaves float32's range
      for (bool keepdim : {false, true}) {
        t["prod_dim"].push_back({n + (keepdim ? "_keepdim" : ""), {r.x}, [view, dim, keepdim](const Inputs& in) {
                                   return Inputs{K::prod_dim(view(in[0]), dim, keepdim)};
                                 }});
      }
      t["prod_dim_backward"].push_back({n, {r.x}, [view, dim](const Inputs& in) {
                                          const Tensor x = view(in[0]);
                                          const Tensor g = Tensor::full(K::prod_dim(x, dim, true).shape(), 0.75,
                                                                        x.dtype(), x.device());
                                          return Inputs{K::prod_dim_backward(g, x, dim)};
                                        }});
    }
  }
  const Tensor scalar = uniform({}, 74);
  t["prod_dim"].push_back({"zero_dim", {scalar}, [](const Inputs& in) { return Inputs{K::prod_dim(in[0], 0, false)}; }});
  t["prod_dim_backward"].push_back({"zero_dim", {scalar}, [](const Inputs& in) {
                                      return Inputs{K::prod_dim_backward(Tensor::full({}, 0.75, in[0].dtype(), in[0].device()), in[0], -1)};
                                    }});
  t["cumsum"].push_back({"zero_dim", {scalar}, [](const Inputs& in) { return Inputs{K::cumsum(in[0], 0, false)}; }});
  add_argsort_cases(t);
}

inline void add_reduce_cases(CaseTable& t) {
  add_sum_and_argmax_cases(t);
  add_sum_dims_and_amax_cases(t);
  add_max_dim_cases(t);
  add_softmax_cases(t);
  add_scan_cases(t);
}

}  // namespace tandem::backend_ops
