// The backend_ops cases of the elementwise and pointwise ops of the table (kernels/ops.h): add,
// sub, mul, scale, binary, binary_backward, compare, where, unary, unary_backward. Each op runs over
// the same layouts: equal shapes, broadcast, size-1 dimensions, transposed and strided views, empty
// and 0-D tensors, every pair of special values (NaN, infinities, signed zeros) and exact ties.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backend_ops_util.h"
#include "kernels/ops.h"

namespace tandem::backend_ops {

using View = Tensor (*)(const Tensor&);
inline Tensor as_is(const Tensor& t) { return t; }

// Two operands and the views taken of them before the op.
struct PairLayout {
  std::string name;
  Tensor a, b;
  View va = as_is, vb = as_is;
};

// Layouts whose operands broadcast (same_shape: only those of equal shapes after the views).
inline std::vector<PairLayout> pair_layouts(bool same_shape, uint64_t seed, bool with_ties) {
  std::vector<PairLayout> l = {
      {"same", uniform({3, 4}, seed), uniform({3, 4}, seed + 1)},
      {"transposed", uniform({4, 3}, seed), uniform({4, 3}, seed + 1), transposed, transposed},
      {"strided", uniform({3, 8}, seed), uniform({3, 4}, seed + 1), every_other},
      {"transposed_and_contiguous", uniform({4, 3}, seed), uniform({3, 4}, seed + 1), transposed},
      {"empty", uniform({0, 4}, seed), uniform({0, 4}, seed + 1)},
      {"zero_dim", uniform({}, seed), uniform({}, seed + 1)},
      {"specials", specials({9}), specials({9}, 4)},
      {"large", uniform({4099}, seed), uniform({4099}, seed + 1)},
  };
  if (with_ties) l.push_back({"ties", ties({5, 6}, seed), ties({5, 6}, seed + 1)});
  if (same_shape) return l;
  l.push_back({"broadcast_row", uniform({3, 1}, seed), uniform({4}, seed + 1)});
  l.push_back({"size_one_dims", uniform({1, 4, 1}, seed), uniform({3, 1, 2}, seed + 1)});
  l.push_back({"scalar_operand", uniform({}, seed), uniform({2, 3}, seed + 1)});
  l.push_back({"empty_broadcast", uniform({0, 1}, seed), uniform({5}, seed + 1)});
  l.push_back({"every_special_pair", specials({9, 1}), specials({9})});
  l.push_back({"transposed_broadcast", uniform({4, 3}, seed), uniform({1, 4}, seed + 1), transposed});
  return l;
}

// Cases of an op of two operands: run(op_a, op_b) with the layout's views taken.
template <typename Fn>
void add_pair_cases(Cases& cases, const std::string& prefix, bool same_shape, bool with_ties, double ulps, Fn fn) {
  for (const PairLayout& l : pair_layouts(same_shape, cases.size() + 11, with_ties)) {
    const View va = l.va, vb = l.vb;
    cases.push_back({prefix + "/" + l.name, {l.a, l.b},
                     [fn, va, vb](const Inputs& in) { return fn(va(in[0]), vb(in[1])); }, ulps});
  }
}

// A gradient of the broadcast shape of a and b.
inline Tensor grad_like(const Tensor& a, const Tensor& b) {
  const Shape s = views::broadcast_shapes(a.shape(), b.shape(), "grad_like");
  return Tensor::full(s, 0.75, a.dtype(), a.device());
}

inline std::vector<kernels::BinaryOp> all_binary_ops() {
  using B = kernels::BinaryOp;
  return {B::Add, B::Sub, B::Mul, B::Div, B::Pow, B::Maximum, B::Minimum};
}
inline std::vector<kernels::UnaryOp> all_unary_ops() {
  using U = kernels::UnaryOp;
  return {U::Neg, U::Exp, U::Log, U::Sqrt, U::Rsqrt, U::Tanh, U::Sigmoid, U::Relu, U::Gelu, U::GeluTanh, U::Silu, U::Abs};
}
inline std::vector<kernels::CompareOp> all_compare_ops() {
  using C = kernels::CompareOp;
  return {C::Eq, C::Ne, C::Lt, C::Le, C::Gt, C::Ge};
}

inline void add_elementwise_cases(CaseTable& t) {
  namespace K = kernels;
  // Same-shape operands: binary takes the op's fast path (and a scalar Mul takes scale).
  for (K::BinaryOp op : {K::BinaryOp::Add, K::BinaryOp::Sub, K::BinaryOp::Mul}) {
    add_pair_cases(t[K::op_name(op)], K::op_name(op), true, true, 1,
                   [op](const Tensor& a, const Tensor& b) { return Inputs{K::binary(op, a, b)}; });
  }
  for (double s : {2.5, -1.0, 0.0}) {
    add_pair_cases(t["scale"], "scale_" + std::to_string(s), true, false, 1,
                   [s](const Tensor& a, const Tensor&) { return Inputs{K::binary(K::BinaryOp::Mul, a, s)}; });
  }
}

inline void add_binary_cases(CaseTable& t) {
  namespace K = kernels;
  for (K::BinaryOp op : all_binary_ops()) {
    const double ulps = op == K::BinaryOp::Pow ? 8 : 1;
    add_pair_cases(t["binary"], K::op_name(op), false, true, ulps,
                   [op](const Tensor& a, const Tensor& b) { return Inputs{K::binary(op, a, b)}; });
    // Both operands' gradients, from the forward output (Div, Pow) and a constant upstream gradient.
    add_pair_cases(t["binary_backward"], K::op_name(op), false, true, 4 * ulps, [op](const Tensor& a, const Tensor& b) {
      const Tensor y = K::binary(op, a, b), g = grad_like(a, b);
      return Inputs{K::binary_backward(op, 0, g, a, b, y), K::binary_backward(op, 1, g, a, b, y)};
    });
  }
  // binary_backward's y is optional for ops other than Div and Pow.
  t["binary_backward"].push_back({"mul/without_y", {uniform({3, 1}, 5), uniform({4}, 6)}, [](const Inputs& in) {
    return Inputs{K::binary_backward(K::BinaryOp::Mul, 0, grad_like(in[0], in[1]), in[0], in[1], Tensor())};
  }});
  for (K::CompareOp op : all_compare_ops()) {
    add_pair_cases(t["compare"], K::op_name(op), false, true, 0,
                   [op](const Tensor& a, const Tensor& b) { return Inputs{K::compare(op, a, b)}; });
  }
}

inline void add_where_cases(CaseTable& t) {
  namespace K = kernels;
  Cases& c = t["where"];
  const Run plain = [](const Inputs& in) { return Inputs{K::where(in[0], in[1], in[2])}; };
  c.push_back({"same", {mask({3, 4}, 1), uniform({3, 4}, 2), uniform({3, 4}, 3)}, plain});
  c.push_back({"broadcast_all_three", {mask({3, 1}, 4), uniform({4}, 5), uniform({}, 6)}, plain});
  c.push_back({"size_one_dims", {mask({1, 4, 1}, 7), uniform({3, 1, 1}, 8), uniform({1, 1, 2}, 9)}, plain});
  c.push_back({"zero_dim", {mask({}, 10), uniform({}, 11), uniform({}, 12)}, plain});
  c.push_back({"empty", {mask({0, 3}, 13), uniform({0, 3}, 14), uniform({3}, 15)}, plain});
  c.push_back({"specials", {mask({9}, 16), specials({9}), specials({9}, 5)}, plain});
  c.push_back({"large", {mask({4099}, 16), uniform({4099}, 17), uniform({4099}, 18)}, plain});
  c.push_back({"transposed_and_strided", {mask({4, 3}, 17), uniform({3, 8}, 18), uniform({4, 3}, 19)},
               [](const Inputs& in) { return Inputs{K::where(transposed(in[0]), every_other(in[1]), transposed(in[2]))}; }});
}

// Unary inputs: float64 values and the view the case takes of them.
inline std::vector<std::pair<std::string, std::pair<Tensor, View>>> unary_layouts(uint64_t seed) {
  return {
      {"values", {uniform({3, 4}, seed, -3.0, 3.0), as_is}},
      {"positive", {uniform({3, 4}, seed, 0.01, 4.0), as_is}},
      {"transposed", {uniform({4, 3}, seed, -3.0, 3.0), transposed}},
      {"strided", {uniform({3, 8}, seed, -3.0, 3.0), every_other}},
      {"zero_dim", {uniform({}, seed), as_is}},
      {"empty", {uniform({0, 2}, seed), as_is}},
      {"size_one_dims", {uniform({1, 3, 1}, seed), as_is}},
      {"specials", {specials({9}), as_is}},
      {"large", {uniform({20000}, seed, -6.0, 6.0), as_is}},
  };
}

inline void add_unary_cases(CaseTable& t) {
  namespace K = kernels;
  for (K::UnaryOp op : all_unary_ops()) {
    // Gelu's float32 kernel approximates erf (kernels/cpu/pointwise.cpp); the rest is libm math.
    // Both gelus' derivatives cancel in float32 in the negative tail (1 + erf or 1 + tanh near 0).
    const bool gelu = op == K::UnaryOp::Gelu || op == K::UnaryOp::GeluTanh;
    const double ulps = op == K::UnaryOp::Gelu ? 16 : 4, backward_ulps = gelu ? 32 : 16;
    for (const auto& [name, in] : unary_layouts(t["unary"].size() + 31)) {
      const View v = in.second;
      const std::string n = std::string(K::op_name(op)) + "/" + name;
      t["unary"].push_back({n, {in.first}, [op, v](const Inputs& x) { return Inputs{K::unary(op, v(x[0]))}; }, ulps});
      t["unary_backward"].push_back({n, {in.first, uniform(in.first.shape(), 77)}, [op, v](const Inputs& x) {
                                       const Tensor xv = v(x[0]), y = K::unary(op, xv);
                                       return Inputs{K::unary_backward(op, v(x[1]), xv, y)};
                                     }, backward_ulps});
    }
  }
}

inline void add_pointwise_cases(CaseTable& t) {
  add_elementwise_cases(t);
  add_binary_cases(t);
  add_where_cases(t);
  add_unary_cases(t);
}

}  // namespace tandem::backend_ops
