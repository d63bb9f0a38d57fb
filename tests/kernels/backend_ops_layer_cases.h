// The backend_ops cases of the layer kernels: relu forward/backward (kernels/activation.h),
// batch_norm forward/backward and its fused relu and relu + 2x2 max-pool forms
// (kernels/batch_norm.h, kernels/batch_norm_pool.h), conv2d forward/backward (kernels/conv.h) and
// fused attention forward/backward (kernels/attention.h). Each runs on plain and strided or
// transposed operands, size-1 and empty dimensions where the op allows them, NaN and infinities
// where the op defines them, ties (relu at 0, equal pooling candidates), and every combination of the
// gradients asked for. Running statistics updated in place are outputs too.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "backend_ops_nn_cases.h"  // defined_grads
#include "backend_ops_util.h"
#include "kernels/ops.h"

namespace tandem::backend_ops {

inline void add_activation_cases(CaseTable& t) {
  namespace K = kernels;
  // [op-cases]
  const Run fwd = [](const Inputs& in) { return Inputs{K::relu_forward(in[0])}; };
  t["relu_forward"] = {{"values", {uniform({4, 9}, 301)}, fwd},
                       {"specials", {specials({3, 7})}, fwd},
                       {"zero_d", {uniform({}, 302)}, fwd},
                       {"empty", {uniform({0, 5}, 303)}, fwd},
                       {"transposed",
                        {uniform({6, 5}, 304)},
                        [](const Inputs& in) { return Inputs{K::relu_forward(transposed(in[0]))}; }},
                       {"strided", {uniform({3, 10}, 305)}, [](const Inputs& in) {
                          return Inputs{K::relu_forward(every_other(in[0]))};
                        }}};
  // [op-cases]
  // ties(): exact zeros, where the gradient is 0 (relu'(0) = 0, as PyTorch).
  const Run bwd = [](const Inputs& in) { return Inputs{K::relu_backward(in[1], K::relu_forward(in[0]))}; };
  t["relu_backward"] = {{"ties", {ties({5, 6}, 306, 3), uniform({5, 6}, 307)}, bwd},
                        {"values", {uniform({4, 9}, 308), uniform({4, 9}, 309)}, bwd},
                        {"specials", {specials({3, 6}), uniform({3, 6}, 310)}, bwd},
                        {"empty", {uniform({0, 3}, 311), uniform({0, 3}, 312)}, bwd},
                        {"transposed_grad", {uniform({4, 6}, 313), uniform({6, 4}, 314)}, [](const Inputs& in) {
                           return Inputs{K::relu_backward(transposed(in[1]), K::relu_forward(in[0]))};
                         }}};
}

// One batch_norm configuration: input x [N, C, ...] (viewed by `view`), affine or not, training or eval.
struct BatchNormInput {
  std::string name;
  Tensor x;
  bool affine = true, training = true;
  Tensor (*view)(const Tensor&) = [](const Tensor& t) { return t; };
};

inline std::vector<BatchNormInput> batch_norm_inputs(uint64_t seed) {
  return {{"train_4d", uniform({3, 4, 5, 6}, seed)},
          {"eval_4d", uniform({2, 4, 5, 6}, seed + 1), true, false},
          {"no_affine_2d", uniform({7, 4}, seed + 2), false},
          {"offset_3d", uniform({4, 4, 9}, seed + 3, 9.0, 11.0)},
          {"strided", uniform({2, 4, 6, 10}, seed + 4), true, true, every_other},
          {"channels_transposed", uniform({4, 5}, seed + 5), true, true, transposed},
          // Each channel's values split over several CUDA blocks: many rows, an uneven spatial size.
          {"many_rows", uniform({5000, 3}, seed + 6)},
          {"uneven_spatial", uniform({16, 2, 33, 31}, seed + 7)}};
}

// Inputs of a batch_norm case: x, weight, bias, running_mean, running_var (positive variances).
inline Inputs batch_norm_operands(const BatchNormInput& b, uint64_t seed) {
  const int64_t C = b.view(b.x).size(1);
  return {b.x, uniform({C}, seed), uniform({C}, seed + 1), uniform({C}, seed + 2), uniform({C}, seed + 3, 0.5, 2.0)};
}

// Runs `forward` (batch_norm_forward or batch_norm_relu_forward) on fresh running statistics; returns
// the forward's tensors and the running statistics after their in-place update.
template <typename Forward>
Inputs run_batch_norm(Forward forward, const BatchNormInput& b, const Inputs& in) {
  const Tensor x = b.view(in[0]);
  const Tensor w = b.affine ? in[1] : Tensor(), bias = b.affine ? in[2] : Tensor();
  const Tensor rm = in[3].clone(), rv = in[4].clone();
  auto r = forward(x, w, bias, rm, rv, b.training, 0.1, 1e-5);
  return {r.output, r.save_mean, r.save_invstd, rm, rv};
}

inline void add_batch_norm_cases(CaseTable& t) {
  namespace K = kernels;
  for (const BatchNormInput& b : batch_norm_inputs(321)) {
    const double mag = static_cast<double>(b.view(b.x).numel() / b.view(b.x).size(1));
    const Inputs operands = batch_norm_operands(b, 331);
    t["batch_norm_forward"].push_back(
        {b.name, operands, [b](const Inputs& in) { return run_batch_norm(K::batch_norm_forward, b, in); }, 16, mag});
    t["batch_norm_relu_forward"].push_back(
        {b.name, operands, [b](const Inputs& in) { return run_batch_norm(K::batch_norm_relu_forward, b, in); }, 16,
         mag});
    Inputs with_grad = operands;
    with_grad.push_back(uniform(b.view(b.x).shape(), 341));
    for (int mask = 1; mask < 8; ++mask) {
      const bool ni = mask & 1, nw = b.affine && (mask & 2), nb = mask & 4;
      if (!ni && !nw && !nb) continue;  // without affine, no gradient asked for
      const std::string n = b.name + "/need_" + std::to_string(mask);
      t["batch_norm_backward"].push_back({n, with_grad,
                                          [b, ni, nw, nb](const Inputs& in) {
                                            const Tensor x = b.view(in[0]), w = b.affine ? in[1] : Tensor();
                                            auto f =
                                                K::batch_norm_forward(x, w, b.affine ? in[2] : Tensor(), in[3].clone(),
                                                                      in[4].clone(), b.training, 0.1, 1e-5);
                                            return defined_grads(K::batch_norm_backward(
                                                in[5], x, w, f.save_mean, f.save_invstd, b.training, ni, nw, nb));
                                          },
                                          64, mag});
      t["batch_norm_relu_backward"].push_back(
          {n, with_grad,
           [b, ni, nw, nb](const Inputs& in) {
             const Tensor x = b.view(in[0]), w = b.affine ? in[1] : Tensor();
             const Tensor bias = b.affine ? in[2] : Tensor();
             auto f = K::batch_norm_relu_forward(x, w, bias, in[3].clone(), in[4].clone(), b.training, 0.1, 1e-5);
             return defined_grads(
                 K::batch_norm_relu_backward(in[5], x, w, bias, f.save_mean, f.save_invstd, b.training, ni, nw, nb));
           },
           64, mag});
    }
  }
}

inline void add_batch_norm_pool_cases(CaseTable& t) {
  namespace K = kernels;
  const std::vector<BatchNormInput> inputs = {{"train", uniform({2, 3, 6, 8}, 351)},
                                              {"eval_odd", uniform({2, 3, 7, 5}, 352), true, false},
                                              {"no_affine", uniform({3, 2, 4, 4}, 353), false},
                                              {"ties", ties({2, 2, 4, 6}, 354, 2), true, true},
                                              {"strided", uniform({2, 3, 4, 12}, 355), true, true, every_other}};
  for (const BatchNormInput& b : inputs) {
    const double mag = static_cast<double>(b.view(b.x).numel() / b.view(b.x).size(1));
    const Inputs operands = batch_norm_operands(b, 361);
    t["batch_norm_relu_max_pool2d_forward"].push_back(
        {b.name, operands,
         [b](const Inputs& in) {
           const Tensor x = b.view(in[0]), rm = in[3].clone(), rv = in[4].clone();
           auto r = K::batch_norm_relu_max_pool2d_forward(x, b.affine ? in[1] : Tensor(), b.affine ? in[2] : Tensor(),
                                                          rm, rv, b.training, 0.1, 1e-5);
           return Inputs{r.output, r.code, r.winner, r.save_mean, r.save_invstd, rm, rv};
         },
         16, mag});
    for (int mask = 1; mask < 8; ++mask) {
      const bool ni = mask & 1, nw = b.affine && (mask & 2), nb = mask & 4;
      if (!ni && !nw && !nb) continue;  // without affine, no gradient asked for
      t["batch_norm_relu_max_pool2d_backward"].push_back(
          {b.name + "/need_" + std::to_string(mask), operands,
           [b, ni, nw, nb](const Inputs& in) {
             const Tensor x = b.view(in[0]), w = b.affine ? in[1] : Tensor(), bias = b.affine ? in[2] : Tensor();
             auto f =
                 K::batch_norm_relu_max_pool2d_forward(x, w, bias, in[3].clone(), in[4].clone(), b.training, 0.1, 1e-5);
             const Tensor g = Tensor::full(f.output.shape(), 0.75, x.dtype(), x.device());
             return defined_grads(K::batch_norm_relu_max_pool2d_backward(g, x, f.code, f.winner, w, bias, f.save_mean,
                                                                         f.save_invstd, b.training, ni, nw, nb));
           },
           64, mag});
    }
  }
}

// The one-channel 3x3 conv with the fused batch norm + relu + max-pool after it (kernels/conv_bn_pool.h):
// operands x, conv weight, conv bias, weight, bias, running mean, running var.
inline void add_conv_batch_norm_pool_cases(CaseTable& t) {
  namespace K = kernels;
  struct Geometry {
    std::string name;
    Shape x;
    int64_t K;
    bool training, conv_bias;
  };
  for (const Geometry& c :
       {Geometry{"train", {3, 1, 9, 8}, 5, true, true}, Geometry{"eval", {2, 1, 7, 6}, 3, false, true},
        Geometry{"train_no_conv_bias", {2, 1, 20, 21}, 17, true, false}}) {
    const int64_t Kc = c.K;
    const Inputs in = {uniform(c.x, 371),          uniform({Kc, 1, 3, 3}, 372), uniform({Kc}, 373), uniform({Kc}, 374),
                       uniform({Kc}, 375),         uniform({Kc}, 376),          uniform({Kc}, 377, 0.5, 2.0)};
    const double mag = double(c.x[0] * (c.x[2] - 2) * (c.x[3] - 2));
    auto forward = [c](const Inputs& v) {
      const Tensor rm = v[5].clone(), rv = v[6].clone();
      auto f = K::conv_batch_norm_relu_max_pool2d_forward(v[0], v[1], c.conv_bias ? v[2] : Tensor(), v[3], v[4], rm, rv,
                                                          c.training, 0.1, 1e-5);
      return std::tuple{f, rm, rv};
    };
    t["conv_batch_norm_relu_max_pool2d_forward"].push_back({c.name, in,
                                                            [forward](const Inputs& v) {
                                                              auto [f, rm, rv] = forward(v);
                                                              return Inputs{f.output, f.code, f.winner, f.save_mean,
                                                                            f.save_invstd, rm, rv};
                                                            },
                                                            16, mag});
    for (int mask = 1; mask < 16; ++mask) {
      const bool ncw = mask & 1, ncb = c.conv_bias && (mask & 2), nw = mask & 4, nb = mask & 8;
      if (!ncw && !ncb && !nw && !nb) continue;
      t["conv_batch_norm_relu_max_pool2d_backward"].push_back(
          {c.name + "/need_" + std::to_string(mask), in,
           [forward, c, ncw, ncb, nw, nb](const Inputs& v) {
             auto [f, rm, rv] = forward(v);
             const Tensor g = Tensor::full(f.output.shape(), 0.75, v[0].dtype(), v[0].device());
             auto r = K::conv_batch_norm_relu_max_pool2d_backward(g, v[0], v[1], c.conv_bias ? v[2] : Tensor(), f,
                                                                  v[3], v[4], c.training, ncw, ncb, nw, nb);
             Inputs out;
             for (const Tensor* x : {&r.conv_weight, &r.conv_bias, &r.weight, &r.bias})
               if (x->defined()) out.push_back(*x);
             return out;
           },
           64, mag * 9});
    }
  }
}

// One conv2d geometry: input [N, C, H, W], weight [K, C, R, S], arguments, bias or not.
struct ConvInput {
  std::string name;
  Shape x, w;
  kernels::Conv2dArgs args;
  bool bias = true;
  bool transpose_x = false;  // the input as a transposed (non-contiguous) view of [N, C, W, H]
};

inline void add_conv_cases(CaseTable& t) {
  namespace K = kernels;
  const std::vector<ConvInput> geometries = {{"k3p1", {2, 3, 6, 5}, {4, 3, 3, 3}, {1, 1, 1, 1}},
                                             {"k3s2_no_bias", {2, 2, 7, 7}, {3, 2, 3, 3}, {2, 2, 0, 0}, false},
                                             {"one_channel_k5", {3, 1, 9, 8}, {2, 1, 5, 5}, {1, 1, 2, 2}},
                                             {"k1", {2, 5, 4, 4}, {3, 5, 1, 1}, {}},
                                             {"k2x3_s1x2", {1, 3, 6, 7}, {2, 3, 2, 3}, {1, 2, 1, 0}},
                                             {"transposed_input", {2, 3, 5, 6}, {2, 3, 3, 3}, {1, 1, 1, 1}, true, true},
                                             {"wide_channels", {2, 32, 12, 12}, {16, 32, 3, 3}, {}},
                                             {"empty_batch", {0, 2, 5, 5}, {3, 2, 3, 3}, {1, 1, 1, 1}}};
  uint64_t seed = 371;
  for (const ConvInput& g : geometries) {
    const double mag = static_cast<double>(g.w[1] * g.w[2] * g.w[3]);
    Shape xs = g.x;
    if (g.transpose_x) std::swap(xs[2], xs[3]);
    const Inputs in = {uniform(xs, seed), uniform(g.w, seed + 1), uniform({g.w[0]}, seed + 2)};
    seed += 3;
    const auto input = [g](const Tensor& x) { return g.transpose_x ? x.transpose(2, 3) : x; };
    t["conv2d_forward"].push_back({g.name, in,
                                   [g, input](const Inputs& v) {
                                     return Inputs{
                                         K::conv2d_forward(input(v[0]), v[1], g.bias ? v[2] : Tensor(), g.args)};
                                   },
                                   8, mag});
    for (int mask = 1; mask < 8; ++mask) {
      const bool ni = mask & 1, nw = mask & 2, nb = mask & 4;
      t["conv2d_backward"].push_back({g.name + "/need_" + std::to_string(mask), in,
                                      [g, input, ni, nw, nb](const Inputs& v) {
                                        const Tensor x = input(v[0]);
                                        const Tensor y = K::conv2d_forward(x, v[1], Tensor(), g.args);
                                        const Tensor gy = Tensor::full(y.shape(), 0.5, x.dtype(), x.device());
                                        const Tensor grad = K::binary(K::BinaryOp::Mul, gy, K::relu_forward(y));
                                        return defined_grads(K::conv2d_backward(grad, x, v[1], g.args, ni, nw, nb));
                                      },
                                      16, 8 * mag});
    }
  }
}

// A 3x3 stride-2 conv and the 1x1 stride-2 projection of the same input (kernels/conv_pair.h): operands
// x, main weight, projection weight. The ResNet's 8->16 block (the fused kernel where AVX-512 is built),
// odd sides and channel counts off the kernels' blocks, one-pixel images, 16->32 (oneDNN's size), a
// transposed input; the backward with each set of gradients asked for, and with one output's gradient
// undefined.
inline void add_conv_pair_cases(CaseTable& t) {
  namespace K = kernels;
  struct Geometry {
    std::string name;
    Shape x;
    int64_t K3, K1;
    bool transpose_x = false;  // x as a transposed (non-contiguous) view of [N, C, W, H]
  };
  const std::vector<Geometry> geometries = {{"resnet_8_16", {2, 8, 28, 28}, 16, 16},
                                            {"odd", {3, 5, 9, 11}, 11, 7},
                                            {"one_pixel", {2, 3, 1, 1}, 2, 3},
                                            {"even_short_rows", {2, 9, 6, 34}, 4, 9},
                                            {"wide_channels", {2, 16, 14, 14}, 32, 32},
                                            {"transposed_input", {2, 4, 7, 6}, 5, 6, true}};
  uint64_t seed = 421;
  for (const Geometry& g : geometries) {
    const int64_t C = g.x[1];
    Shape xs = g.x;
    if (g.transpose_x) std::swap(xs[2], xs[3]);
    const Inputs in = {uniform(xs, seed), uniform({g.K3, C, 3, 3}, seed + 1), uniform({g.K1, C, 1, 1}, seed + 2)};
    seed += 3;
    const auto input = [g](const Tensor& x) { return g.transpose_x ? x.transpose(2, 3) : x; };
    const double mag = double(C * 9);
    t["conv2d_pair_forward"].push_back({g.name, in,
                                        [input](const Inputs& v) {
                                          auto y = K::conv2d_pair_forward(input(v[0]), v[1], v[2]);
                                          return Inputs{y.main, y.projection};
                                        },
                                        8, mag});
    // mask bits: the input's, the main weight's, the projection weight's gradient; 8: grad_projection
    // undefined, 16: grad_main undefined.
    for (int mask : {1, 2, 3, 4, 5, 6, 7, 8 + 7, 16 + 7, 16 + 1}) {
      const bool ni = mask & 1, n3 = mask & 2, n1 = mask & 4, no_gp = mask & 8, no_gm = mask & 16;
      t["conv2d_pair_backward"].push_back(
          {g.name + "/need_" + std::to_string(mask), in,
           [input, ni, n3, n1, no_gp, no_gm](const Inputs& v) {
             const Tensor x = input(v[0]);
             auto y = K::conv2d_pair_forward(x, v[1], v[2]);
             // Gradients that vary in sign and size: relu(y) and -y / 2.
             const Tensor gm = no_gm ? Tensor() : K::relu_forward(y.main);
             const Tensor gp =
                 no_gp ? Tensor() : K::binary(K::BinaryOp::Mul, Tensor::full(y.projection.shape(), -0.5,
                                                                              x.dtype(), x.device()), y.projection);
             auto r = K::conv2d_pair_backward(gm, gp, x, v[1], v[2], ni, n3, n1);
             Inputs out;
             for (const Tensor* d : {&r.input, &r.main_weight, &r.projection_weight})
               if (d->defined()) out.push_back(*d);
             return out;
           },
           16, 32 * mag});
    }
  }
}

inline void add_attention_cases(CaseTable& t) {
  namespace K = kernels;
  struct Geometry {
    std::string name;
    int64_t B, L, S, E, Ev;
    bool causal;
    bool transposed_k;  // k as a transposed view of [B, E, S]
  };
  const std::vector<Geometry> geometries = {
      {"square", 2, 5, 5, 4, 4, false, false},       {"causal", 2, 6, 6, 3, 5, true, false},
      {"causal_l_ne_s", 1, 3, 7, 4, 2, true, false}, {"one_key", 3, 4, 1, 2, 3, false, false},
      {"long_rows", 1, 2, 150, 8, 4, false, false},  {"transposed_k", 2, 4, 5, 3, 3, false, true}};
  uint64_t seed = 391;
  for (const Geometry& g : geometries) {
    const Shape ks = g.transposed_k ? Shape{g.B, g.E, g.S} : Shape{g.B, g.S, g.E};
    const Inputs in = {uniform({g.B, g.L, g.E}, seed), uniform(ks, seed + 1), uniform({g.B, g.S, g.Ev}, seed + 2),
                       uniform({g.B, g.L, g.Ev}, seed + 3)};
    seed += 4;
    const double scale = 0.7;
    const auto key = [g](const Tensor& k) { return g.transposed_k ? k.transpose(1, 2) : k; };
    const double mag = static_cast<double>(g.S + g.E);
    t["attention_forward"].push_back({g.name, in,
                                      [g, key, scale](const Inputs& v) {
                                        auto r = K::attention_forward(v[0], key(v[1]), v[2], scale, g.causal);
                                        return Inputs{r.output, r.lse};
                                      },
                                      32, mag});
    t["attention_backward"].push_back({g.name, in,
                                       [g, key, scale](const Inputs& v) {
                                         const Tensor k = key(v[1]);
                                         auto f = K::attention_forward(v[0], k, v[2], scale, g.causal);
                                         auto r = K::attention_backward(v[3], v[0], k, v[2], f.output, f.lse, scale,
                                                                        g.causal);
                                         return Inputs{r.q, r.k, r.v};
                                       },
                                       64, mag});
  }
}

inline void add_layer_cases(CaseTable& t) {
  add_activation_cases(t);
  add_batch_norm_cases(t);
  add_batch_norm_pool_cases(t);
  add_conv_batch_norm_pool_cases(t);
  add_conv_cases(t);
  add_conv_pair_cases(t);
  add_attention_cases(t);
}

}  // namespace tandem::backend_ops
