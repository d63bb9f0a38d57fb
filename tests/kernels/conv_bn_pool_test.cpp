// The fused one-channel conv + batch norm + relu + 2x2 max-pool (kernels/conv_bn_pool.h) against the ops
// it interleaves, called one by one (conv2d_forward, batch_norm_relu_max_pool2d_forward and their
// backwards): every output, statistic and gradient bitwise, in training and eval, with and without a conv
// bias, for MnistNet's shape and ragged ones, at 1, 2 and 3 threads; float64 (the composed path) within
// rounding; bad arguments get messages naming them.
#include "kernels/conv_bn_pool.h"

#include <gtest/gtest.h>

#include <string>

#include "kernel_test_util.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/conv.h"

using namespace tandem;
using namespace tandem::test;

namespace {

struct Operands {
  Tensor x, cw, cb, w, b, rm, rv, gy;
};

Operands make(const Shape& x, int64_t K, bool conv_bias, DType dtype, uint64_t seed) {
  Generator gen(seed);
  Operands o;
  o.x = random_tensor(x, dtype, gen, 0.0, 1.0);
  o.cw = random_tensor({K, 1, 3, 3}, dtype, gen, -0.5, 0.5);
  if (conv_bias) o.cb = random_tensor({K}, dtype, gen, -0.2, 0.2);
  o.w = random_tensor({K}, dtype, gen, 0.5, 1.5);
  o.b = random_tensor({K}, dtype, gen, -0.3, 0.3);
  o.rm = random_tensor({K}, dtype, gen, -0.1, 0.1);
  o.rv = random_tensor({K}, dtype, gen, 0.5, 1.5);
  o.gy = random_tensor({x[0], K, (x[2] - 2) / 2, (x[3] - 2) / 2}, dtype, gen);
  return o;
}

struct Result {
  Tensor y, code, winner, mean, invstd, rm, rv, dcw, dcb, dw, db;
};

Result fused(const Operands& o, bool training) {
  Result r;
  r.rm = o.rm.clone(), r.rv = o.rv.clone();
  auto f = kernels::conv_batch_norm_relu_max_pool2d_forward(o.x, o.cw, o.cb, o.w, o.b, r.rm, r.rv, training, 0.1, 1e-5);
  auto g = kernels::conv_batch_norm_relu_max_pool2d_backward(o.gy, o.x, o.cw, o.cb, f, o.w, o.b, training, true,
                                                             o.cb.defined(), true, true);
  r.y = f.output, r.code = f.code, r.winner = f.winner, r.mean = f.save_mean, r.invstd = f.save_invstd;
  r.dcw = g.conv_weight, r.dcb = g.conv_bias, r.dw = g.weight, r.db = g.bias;
  return r;
}

Result one_by_one(const Operands& o, bool training) {
  Result r;
  r.rm = o.rm.clone(), r.rv = o.rv.clone();
  const Tensor h = kernels::conv2d_forward(o.x, o.cw, o.cb, {});
  auto f = kernels::batch_norm_relu_max_pool2d_forward(h, o.w, o.b, r.rm, r.rv, training, 0.1, 1e-5);
  auto g = kernels::batch_norm_relu_max_pool2d_backward(o.gy, h, f.code, f.winner, o.w, o.b, f.save_mean, f.save_invstd,
                                                        training, true, true, true);
  auto c = kernels::conv2d_backward(g.input, o.x, o.cw, {}, false, true, o.cb.defined());
  r.y = f.output, r.code = f.code, r.winner = f.winner, r.mean = f.save_mean, r.invstd = f.save_invstd;
  r.dcw = c.weight, r.dcb = c.bias, r.dw = g.weight, r.db = g.bias;
  return r;
}

void expect_same(const Result& a, const Result& b, const std::string& where) {
  const std::pair<const char*, std::pair<Tensor, Tensor>> fields[] = {{"output", {a.y, b.y}},
                                                                      {"code", {a.code, b.code}},
                                                                      {"winner", {a.winner, b.winner}},
                                                                      {"save_mean", {a.mean, b.mean}},
                                                                      {"save_invstd", {a.invstd, b.invstd}},
                                                                      {"running_mean", {a.rm, b.rm}},
                                                                      {"running_var", {a.rv, b.rv}},
                                                                      {"conv weight grad", {a.dcw, b.dcw}},
                                                                      {"weight grad", {a.dw, b.dw}},
                                                                      {"bias grad", {a.db, b.db}}};
  for (const auto& [name, t] : fields) EXPECT_TRUE(same_bits(t.first, t.second)) << where << ": " << name;
  EXPECT_EQ(a.dcb.defined(), b.dcb.defined()) << where;
  if (a.dcb.defined()) {
    EXPECT_TRUE(same_bits(a.dcb, b.dcb)) << where << ": conv bias grad";
  }
}

TEST(ConvBatchNormReluPool, BitwiseTheOpsOneByOne) {
  struct Geometry {
    Shape x;
    int64_t K;
    bool conv_bias;
  };
  for (const Geometry& g : {Geometry{{64, 1, 28, 28}, 32, true}, Geometry{{5, 1, 11, 9}, 7, false},
                            Geometry{{3, 1, 21, 40}, 17, true}, Geometry{{1, 1, 4, 4}, 2, true}}) {
    const Operands o = make(g.x, g.K, g.conv_bias, kFloat32, 11 + g.K);
    for (bool training : {true, false}) {
      for (int threads : {1, 2, 3}) {
        ThreadCountGuard guard(threads);
        const std::string where = shape_str(g.x) + " K=" + std::to_string(g.K) + (training ? " train" : " eval") +
                                  " threads=" + std::to_string(threads);
        expect_same(fused(o, training), one_by_one(o, training), where);
      }
    }
  }
}

TEST(ConvBatchNormReluPool, Float64ComposesTheOps) {
  const Operands o = make({3, 1, 9, 10}, 4, true, kFloat64, 5);
  const Result a = fused(o, true), b = one_by_one(o, true);
  for (const auto& [got, ref] : {std::pair{a.y, b.y}, {a.dcw, b.dcw}, {a.dcb, b.dcb}, {a.dw, b.dw}, {a.db, b.db}})
    EXPECT_TRUE(all_close(got, values(ref), tol_for(kFloat64)));
}

TEST(ConvBatchNormReluPool, BadArgumentsAreNamed) {
  const Operands o = make({2, 1, 8, 8}, 4, true, kFloat32, 3);
  auto forward = [&](const Tensor& x, const Tensor& cw, const Tensor& w) {
    Tensor rm = o.rm.clone(), rv = o.rv.clone();
    return kernels::conv_batch_norm_relu_max_pool2d_forward(x, cw, o.cb, w, o.b, rm, rv, true, 0.1, 1e-5);
  };
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              forward(Tensor::zeros({2, 3, 8, 8}), o.cw, o.w);
            }).find("expected input [N, 1, H, W]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              forward(o.x, Tensor::zeros({4, 1, 5, 5}), o.w);
            }).find("expected conv_weight [K, 1, 3, 3]"),
            std::string::npos);
  EXPECT_NE(message([&] { forward(o.x, o.cw, Tensor::ones({5})); }).find("weight of shape [4]"), std::string::npos);
  auto f = forward(o.x, o.cw, o.w);
  const std::string bad_grad = message([&] {
    kernels::conv_batch_norm_relu_max_pool2d_backward(Tensor::zeros({2, 4, 2, 2}), o.x, o.cw, o.cb, f, o.w, o.b, true,
                                                      true, true, true, true);
  });
  EXPECT_NE(bad_grad.find("expected grad_out [2, 4, 3, 3]"), std::string::npos) << bad_grad;
}

}  // namespace
