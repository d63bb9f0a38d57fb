// The backend_ops cases of the network-layer kernels: linear_forward/backward and 2-D matmul
// (kernels/linear.h), the rows' log_softmax, nll_loss and the class-target pass (kernels/loss.h),
// layer_norm forward/backward (kernels/layer_norm.h). Each runs on plain and transposed operands,
// size-1 and long inner dimensions, large logits, NaN in a row, empty batches where the op allows
// them, and every combination of the gradients asked for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops_util.h"
#include "kernels/ops.h"

namespace tandem::backend_ops {

// The defined members of a gradient struct, in order.
template <typename Grads>
Inputs defined_grads(const Grads& g) {
  Inputs out;
  for (const Tensor* t : {&g.input, &g.weight, &g.bias})
    if (t->defined()) out.push_back(*t);
  return out;
}

inline void add_linear_cases(CaseTable& t) {
  namespace K = kernels;
  const Run with_bias = [](const Inputs& in) { return Inputs{K::linear_forward(in[0], in[1], in[2])}; };
  t["linear_forward"] = {
      {"bias", {uniform({5, 7}, 141), uniform({3, 7}, 142), uniform({3}, 143)}, with_bias, 4, 8},
      {"no_bias", {uniform({4, 64}, 144), uniform({6, 64}, 145)},
       [](const Inputs& in) { return Inputs{K::linear_forward(in[0], in[1], Tensor())}; }, 4, 64},
      {"transposed_x", {uniform({7, 5}, 146), uniform({3, 7}, 147), uniform({3}, 148)},
       [](const Inputs& in) { return Inputs{K::linear_forward(transposed(in[0]), in[1], in[2])}; }, 4, 8},
      {"one_feature", {uniform({6, 1}, 149), uniform({2, 1}, 150), uniform({2}, 151)}, with_bias, 4, 2},
      {"empty_batch", {uniform({0, 7}, 152), uniform({3, 7}, 153), uniform({3}, 154)}, with_bias}};
  for (int mask = 1; mask < 8; ++mask) {
    const bool ni = mask & 1, nw = mask & 2, nb = mask & 4;
    t["linear_backward"].push_back({"need_" + std::to_string(mask),
                                    {uniform({5, 3}, 155), uniform({5, 7}, 156), uniform({3, 7}, 157)},
                                    [ni, nw, nb](const Inputs& in) {
                                      return defined_grads(K::linear_backward(in[0], in[1], in[2], ni, nw, nb));
                                    }, 4, 8});
  }
  const Run mm = [](const Inputs& in) { return Inputs{K::matmul(in[0], in[1])}; };
  t["matmul"] = {{"plain", {uniform({4, 6}, 158), uniform({6, 3}, 159)}, mm, 4, 6},
                 {"long_k", {uniform({2, 500}, 160), uniform({500, 3}, 161)}, mm, 4, 500},
                 {"transposed", {uniform({6, 4}, 162), uniform({3, 6}, 163)},
                  [](const Inputs& in) { return Inputs{K::matmul(transposed(in[0]), transposed(in[1]))}; }, 4, 6},
                 {"empty_k", {uniform({3, 0}, 164), uniform({0, 2}, 165)}, mm}};
}

inline void add_loss_cases(CaseTable& t) {
  namespace K = kernels;
  const Run lsm = [](const Inputs& in) { return Inputs{K::softmax_forward(in[0], 1, true)}; };
  t["log_softmax_forward"] = {{"values", {uniform({4, 10}, 171)}, lsm, 8, 4},
                              {"large_logits", {uniform({3, 6}, 172, 9990.0, 10010.0)}, lsm, 8, 4},
                              {"one_class", {uniform({5, 1}, 173)}, lsm},
                              {"specials", {specials({3, 6})}, lsm},
                              {"transposed", {uniform({7, 3}, 174)},
                               [](const Inputs& in) { return Inputs{K::softmax_forward(transposed(in[0]), 1, true)}; }, 8, 4}};
  t["log_softmax_backward"] = {{"values", {uniform({4, 10}, 175), uniform({4, 10}, 176)}, [](const Inputs& in) {
                                  return Inputs{K::softmax_backward(in[1], K::softmax_forward(in[0], 1, true), 1, true)};
                                }, 16, 10}};
  // nll_loss's fast path (reduction "mean", no class weights): every row kept, some ignored, all
  // ignored (NaN forward, zero gradient).
  const Tensor targets = Tensor::from_vector<int64_t>({2, 0, 4, 4, 1}, {5});
  const Tensor some_ignored = Tensor::from_vector<int64_t>({2, -100, 4, -100, 1}, {5});
  const Tensor all_ignored = Tensor::full({5}, -100.0, kInt64);
  const Run nll = [](const Inputs& in) { return Inputs{K::nll_loss_forward(in[0], in[1], {})}; };
  const Run nll_grad = [](const Inputs& in) { return Inputs{K::nll_loss_backward(in[2], in[0], in[1], {})}; };
  const Tensor lp = K::softmax_forward(uniform({5, 5}, 177), 1, true);
  t["nll_loss_mean_forward"] = {{"values", {lp, targets}, nll, 4, 5},
                                {"ignored", {lp, some_ignored}, nll, 4, 5},
                                {"all_ignored", {lp, all_ignored}, nll}};
  t["nll_loss_mean_backward"] = {{"values", {uniform({5, 5}, 178), targets, uniform({}, 179)}, nll_grad},
                                 {"ignored", {uniform({5, 5}, 178), some_ignored, uniform({}, 179)}, nll_grad},
                                 {"all_ignored", {uniform({5, 5}, 178), all_ignored, uniform({}, 179)}, nll_grad}};
  const Tensor with_ignored = Tensor::from_vector<int64_t>({3, -100, 0, 2, -100, 3}, {2, 3});
  for (DType keep : {kFloat32, kFloat64}) {
    t["class_targets"].push_back({std::string("keep_") + dtype_name(keep), {with_ignored}, [keep](const Inputs& in) {
                                    auto r = K::class_targets(in[0], 4, -100, keep);
                                    return Inputs{r.keep.to(kInt64), r.safe};  // keep: its own dtype, compared as 0/1
                                  }});
  }
}

inline void add_layer_norm_cases(CaseTable& t) {
  namespace K = kernels;
  t["layer_norm_forward"] = {
      {"affine", {uniform({3, 4, 5}, 181), uniform({5}, 182), uniform({5}, 183)},
       [](const Inputs& in) {
         auto r = K::layer_norm_forward(in[0], 5, in[1], in[2], 1e-5);
         return Inputs{r.output, r.mean, r.rstd};
       }, 16, 4},
      {"plain_two_dims", {uniform({2, 3, 4}, 184, 9.0, 11.0)},
       [](const Inputs& in) {
         auto r = K::layer_norm_forward(in[0], 12, Tensor(), Tensor(), 1e-5);
         return Inputs{r.output, r.mean, r.rstd};
       }, 64, 4},
      {"empty_rows", {uniform({0, 5}, 185)}, [](const Inputs& in) {
         auto r = K::layer_norm_forward(in[0], 5, Tensor(), Tensor(), 1e-5);
         return Inputs{r.output};
       }}};
  for (int mask = 1; mask < 8; ++mask) {
    const bool ni = mask & 1, nw = mask & 2, nb = mask & 4;
    t["layer_norm_backward"].push_back({"need_" + std::to_string(mask),
                                        {uniform({6, 8}, 186), uniform({8}, 187), uniform({6, 8}, 188)},
                                        [ni, nw, nb](const Inputs& in) {
                                          auto f = K::layer_norm_forward(in[0], 8, in[1], Tensor(), 1e-5);
                                          return defined_grads(
                                              K::layer_norm_backward(in[2], in[0], f.mean, f.rstd, in[1], ni, nw, nb));
                                        }, 32, 8});
  }
}

inline void add_nn_cases(CaseTable& t) {
  add_linear_cases(t);
  add_loss_cases(t);
  add_layer_norm_cases(t);
}

}  // namespace tandem::backend_ops
