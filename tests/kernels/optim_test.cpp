// Fused optimizer updates (SGD, Adadelta, Adam, AdamW) over 3 steps against
// a plain re-statement of torch.optim's update rules (PyTorch 1.13,
// single-tensor path) in double; float32 and float64; large tensors on
// several threads; argument errors.
#include "kernels/optim.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

using namespace tandem;
using namespace tandem::test;
using tandem::kernels::AdadeltaStep;
using tandem::kernels::AdamStep;
using tandem::kernels::SgdStep;

namespace {

constexpr int kSteps = 3;

struct SgdConfig {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// torch.optim.SGD (1.13):
//   d_p = grad + weight_decay * param
//   if momentum != 0: buf = clone(d_p) on the first step, else buf = momentum*buf + (1-dampening)*d_p
//                     d_p = d_p + momentum*buf if nesterov else buf
//   param -= lr * d_p
void check_sgd(const SgdConfig& cfg, DType dtype, int64_t n, uint64_t seed) {
  Generator gen(seed);
  Tensor p = random_tensor({n}, dtype, gen);
  Tensor buf = cfg.momentum != 0 ? Tensor::zeros({n}, dtype) : Tensor();
  std::vector<double> rp = values(p), rbuf(n, 0.0);
  for (int step = 0; step < kSteps; ++step) {
    const Tensor g = random_tensor({n}, dtype, gen);
    const std::vector<double> gv = values(g);
    for (int64_t i = 0; i < n; ++i) {
      double d = gv[i] + cfg.weight_decay * rp[i];
      if (cfg.momentum != 0) {
        rbuf[i] = step == 0 ? d : cfg.momentum * rbuf[i] + (1 - cfg.dampening) * d;
        d = cfg.nesterov ? d + cfg.momentum * rbuf[i] : rbuf[i];
      }
      rp[i] -= cfg.lr * d;
    }
    const SgdStep s{float(cfg.lr),           float(cfg.momentum), float(cfg.dampening),
                    float(cfg.weight_decay), cfg.nesterov,        step == 0};
    kernels::sgd_update(p, g, buf, s);
  }
  const Tol tol = dtype == kFloat64 ? Tol{1e-7, 1e-7} : Tol{1e-5, 1e-5};
  EXPECT_TRUE(all_close(p, rp, tol)) << "param";
  if (cfg.momentum != 0) {
    EXPECT_TRUE(all_close(buf, rbuf, tol)) << "momentum buffer";
  }
}

// torch.optim.Adadelta (1.13):
//   grad = grad + weight_decay * param
//   square_avg = rho*square_avg + (1-rho)*grad^2
//   std = sqrt(square_avg + eps); delta = sqrt(acc_delta + eps) / std * grad
//   acc_delta = rho*acc_delta + (1-rho)*delta^2
//   param -= lr * delta
void check_adadelta(double lr, double rho, double eps, double wd, DType dtype, int64_t n, uint64_t seed) {
  Generator gen(seed);
  Tensor p = random_tensor({n}, dtype, gen);
  Tensor sq = Tensor::zeros({n}, dtype), acc = Tensor::zeros({n}, dtype);
  std::vector<double> rp = values(p), rsq(n, 0.0), racc(n, 0.0);
  for (int step = 0; step < kSteps; ++step) {
    const Tensor g = random_tensor({n}, dtype, gen);
    const std::vector<double> gv = values(g);
    for (int64_t i = 0; i < n; ++i) {
      const double grad = gv[i] + wd * rp[i];
      rsq[i] = rho * rsq[i] + (1 - rho) * grad * grad;
      const double delta = std::sqrt(racc[i] + eps) / std::sqrt(rsq[i] + eps) * grad;
      racc[i] = rho * racc[i] + (1 - rho) * delta * delta;
      rp[i] -= lr * delta;
    }
    kernels::adadelta_update(p, g, sq, acc, AdadeltaStep{float(lr), float(rho), float(eps), float(wd)});
  }
  const Tol tol = dtype == kFloat64 ? Tol{1e-7, 1e-6} : Tol{1e-5, 1e-4};
  EXPECT_TRUE(all_close(p, rp, tol)) << "param";
  EXPECT_TRUE(all_close(sq, rsq, tol)) << "square_avg";
  EXPECT_TRUE(all_close(acc, racc, tol)) << "acc_delta";
}

// torch.optim.Adam / AdamW (1.13, amsgrad off):
//   AdamW: param *= 1 - lr*weight_decay;  Adam: grad = grad + weight_decay*param
//   m = beta1*m + (1-beta1)*grad; v = beta2*v + (1-beta2)*grad^2
//   bc1 = 1 - beta1^step; bc2 = 1 - beta2^step
//   param -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
void check_adam(bool decoupled, double wd, DType dtype, int64_t n, uint64_t seed) {
  const double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  Generator gen(seed);
  Tensor p = random_tensor({n}, dtype, gen);
  Tensor m = Tensor::zeros({n}, dtype), v = Tensor::zeros({n}, dtype);
  std::vector<double> rp = values(p), rm(n, 0.0), rv(n, 0.0);
  for (int step = 1; step <= kSteps; ++step) {
    const Tensor g = random_tensor({n}, dtype, gen);
    const std::vector<double> gv = values(g);
    const double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
    for (int64_t i = 0; i < n; ++i) {
      double grad = gv[i];
      if (decoupled) {
        rp[i] *= 1 - lr * wd;
      } else {
        grad += wd * rp[i];
      }
      rm[i] = beta1 * rm[i] + (1 - beta1) * grad;
      rv[i] = beta2 * rv[i] + (1 - beta2) * grad * grad;
      rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
    }
    const AdamStep s = AdamStep::make(lr, beta1, beta2, eps, wd, decoupled, bc1, bc2);
    kernels::adam_update(p, g, m, v, s);
  }
  const Tol tol = dtype == kFloat64 ? Tol{1e-6, 1e-5} : Tol{1e-5, 1e-4};
  EXPECT_TRUE(all_close(p, rp, tol)) << "param";
  EXPECT_TRUE(all_close(m, rm, tol)) << "exp_avg";
  EXPECT_TRUE(all_close(v, rv, tol)) << "exp_avg_sq";
}

}  // namespace

TEST(SgdUpdate, PlainMomentumNesterovDampeningWeightDecay) {
  for (DType dtype : {kFloat64, kFloat32}) {
    SCOPED_TRACE(dtype_name(dtype));
    check_sgd({0.1, 0.0, 0.0, 0.0, false}, dtype, 37, 1);   // plain, no buffer
    check_sgd({0.1, 0.0, 0.0, 0.01, false}, dtype, 37, 2);  // weight decay, no buffer
    check_sgd({0.05, 0.9, 0.0, 0.0, false}, dtype, 37, 3);  // momentum
    check_sgd({0.05, 0.9, 0.1, 1e-3, false}, dtype, 37, 4);
    check_sgd({0.05, 0.9, 0.0, 1e-3, true}, dtype, 37, 5);  // nesterov
  }
}

TEST(AdadeltaUpdate, MatchesTorchRule) {
  for (DType dtype : {kFloat64, kFloat32}) {
    SCOPED_TRACE(dtype_name(dtype));
    check_adadelta(1.0, 0.9, 1e-6, 0.0, dtype, 41, 6);  // the MNIST recipe
    check_adadelta(0.5, 0.95, 1e-6, 0.01, dtype, 41, 7);
  }
}

TEST(AdamUpdate, AdamAndAdamW) {
  for (DType dtype : {kFloat64, kFloat32}) {
    SCOPED_TRACE(dtype_name(dtype));
    check_adam(false, 0.0, dtype, 29, 8);
    check_adam(false, 0.01, dtype, 29, 9);
    check_adam(true, 0.01, dtype, 29, 10);
  }
}

TEST(OptimUpdate, LargeTensorsOnSeveralThreads) {
  ThreadCountGuard guard(2);
  check_sgd({0.05, 0.9, 0.0, 1e-3, true}, kFloat32, 204800, 11);
  check_adadelta(1.0, 0.9, 1e-6, 0.0, kFloat32, 204800, 12);
  check_adam(true, 0.01, kFloat32, 100001, 13);
}

TEST(OptimUpdate, RejectsBadArguments) {
  const Tensor p = Tensor::zeros({4}), g = Tensor::zeros({4});
  const SgdStep momentum{0.1f, 0.9f, 0.0f, 0.0f, false, true};
  EXPECT_TRUE(throws_with([&] { kernels::sgd_update(p, g, Tensor(), momentum); }, {"momentum buffer"}));
  EXPECT_TRUE(throws_with([&] { kernels::sgd_update(p, Tensor::zeros({5}), Tensor(), SgdStep{}); },
                          {"grad", "does not match"}));
  const Tensor strided = Tensor::zeros({4, 2}).select(1, 0);
  EXPECT_TRUE(throws_with(
      [&] { kernels::adadelta_update(strided, g, Tensor::zeros({4}), Tensor::zeros({4}), AdadeltaStep{}); },
      {"contiguous"}));
  EXPECT_TRUE(throws_with(
      [&] { kernels::adam_update(p, g, Tensor::zeros({4}, kFloat64), Tensor::zeros({4}), AdamStep{}); },
      {"float32"}));
}
