// The backend_ops cases of the indexing ops and bmm (kernels/index.h): index_select, index_add (its
// backward, with a skipped index), gather, scatter_add along each dimension, with repeated indices,
// transposed and strided inputs, empty index lists, 0-D tensors; bmm on plain, transposed and empty
// batches. index_add and scatter_add sum repeated positions (on CUDA with atomics, in any order: the
// tolerance is that of a sum of their terms).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops_util.h"
#include "kernels/ops.h"

namespace tandem::backend_ops {

inline Tensor indices(const std::vector<int64_t>& v, const Shape& shape) { return Tensor::from_vector<int64_t>(v, shape); }

// Indices in [0, n) with repeats, `shape` of them.
inline Tensor random_indices(const Shape& shape, int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> v(shape_numel(shape));
  for (int64_t& i : v) i = static_cast<int64_t>(gen.below(static_cast<uint64_t>(n)));
  return indices(v, shape);
}

inline void add_select_cases(CaseTable& t) {
  namespace K = kernels;
  const Tensor x = uniform({4, 5, 3}, 101);
  for (int64_t dim : {0, 1, -1}) {
    const int64_t n = x.size(dim);
    const std::string d = "dim_" + std::to_string(dim);
    t["index_select"].push_back({d, {x, random_indices({6}, n, 102 + dim)}, [dim](const Inputs& in) {
                                   return Inputs{K::index_select(in[0], dim, in[1])};
                                 }});
    Shape src_shape = x.shape();
    src_shape[dim < 0 ? dim + 3 : dim] = 6;
    t["index_add"].push_back({d, {uniform(src_shape, 104 + dim), random_indices({6}, n, 105 + dim)},
                              [shape = x.shape(), dim](const Inputs& in) {
                                return Inputs{K::index_add(shape, dim, in[1], in[0])};
                              }, 4, 6});
  }
  t["index_select"].push_back({"transposed", {uniform({5, 4}, 107), indices({3, 0, 3}, {3})},
                               [](const Inputs& in) { return Inputs{K::index_select(transposed(in[0]), 1, in[1])}; }});
  t["index_select"].push_back({"empty_index", {uniform({5, 4}, 108), indices({}, {0})},
                               [](const Inputs& in) { return Inputs{K::index_select(in[0], 0, in[1])}; }});
  t["index_select"].push_back({"zero_dim", {uniform({}, 109), indices({0}, {})},
                               [](const Inputs& in) { return Inputs{K::index_select(in[0], 0, in[1])}; }});
  t["index_add"].push_back({"skip", {uniform({4, 3}, 110), indices({2, 1, 2, 0}, {4})}, [](const Inputs& in) {
                              return Inputs{K::index_add({5, 3}, 0, in[1], in[0], /*skip=*/2)};
                            }, 4, 4});
}

inline void add_gather_cases(CaseTable& t) {
  namespace K = kernels;
  const Tensor x = uniform({3, 5}, 111);
  t["gather"].push_back({"dim_1", {x, random_indices({3, 4}, 5, 112)},
                         [](const Inputs& in) { return Inputs{K::gather(in[0], 1, in[1])}; }});
  t["gather"].push_back({"dim_0", {x, random_indices({2, 5}, 3, 113)},
                         [](const Inputs& in) { return Inputs{K::gather(in[0], 0, in[1])}; }});
  t["gather"].push_back({"strided", {uniform({3, 10}, 114), random_indices({3, 2}, 5, 115)},
                         [](const Inputs& in) { return Inputs{K::gather(every_other(in[0]), -1, in[1])}; }});
  t["gather"].push_back({"specials", {specials({2, 6}), random_indices({2, 6}, 6, 116)},
                         [](const Inputs& in) { return Inputs{K::gather(in[0], 1, in[1])}; }});
  t["scatter_add"].push_back({"dim_1", {uniform({3, 4}, 117), random_indices({3, 4}, 5, 118)},
                              [](const Inputs& in) { return Inputs{K::scatter_add({3, 5}, 1, in[1], in[0])}; }, 4, 4});
  t["scatter_add"].push_back({"dim_0", {uniform({6, 2}, 119), random_indices({6, 2}, 3, 120)},
                              [](const Inputs& in) { return Inputs{K::scatter_add({3, 2}, 0, in[1], in[0])}; }, 4, 6});
  t["scatter_add"].push_back({"empty", {uniform({0, 2}, 121), indices({}, {0, 2})},
                              [](const Inputs& in) { return Inputs{K::scatter_add({3, 2}, 0, in[1], in[0])}; }});
}

inline void add_bmm_cases(CaseTable& t) {
  namespace K = kernels;
  const Run plain = [](const Inputs& in) { return Inputs{K::bmm(in[0], in[1])}; };
  t["bmm"].push_back({"plain", {uniform({2, 3, 4}, 122), uniform({2, 4, 5}, 123)}, plain, 4, 4});
  t["bmm"].push_back({"transposed", {uniform({2, 4, 3}, 124), uniform({2, 5, 4}, 125)}, [](const Inputs& in) {
                        return Inputs{K::bmm(in[0].transpose(1, 2), in[1].transpose(1, 2))};
                      }, 4, 4});
  t["bmm"].push_back({"long_k", {uniform({3, 2, 300}, 126), uniform({3, 300, 2}, 127)}, plain, 4, 300});
  t["bmm"].push_back({"empty_batch", {uniform({0, 3, 4}, 128), uniform({0, 4, 5}, 129)}, plain});
  t["bmm"].push_back({"empty_k", {uniform({2, 3, 0}, 130), uniform({2, 0, 5}, 131)}, plain});
}

inline void add_index_cases(CaseTable& t) {
  add_select_cases(t);
  add_gather_cases(t);
  add_bmm_cases(t);
}

}  // namespace tandem::backend_ops
