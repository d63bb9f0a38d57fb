// Per-element math of the general pointwise ops (kernels/pointwise.h), written once and used by
// the CPU kernels (kernels/cpu/pointwise.cpp) and the CUDA kernels (kernels/cuda/pointwise.cu)
// alike: host-device functions of scalars in the element type (float or double), PyTorch's
// formulas. gelu is x * Phi(x) (erf) or its tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x +
// 0.044715 x^3))), silu is x * sigmoid(x). The float overloads call the C library's float
// functions on the host (expf, erff, ...) and CUDA's on the device, each within a few ulp.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/functors.h"
#include "kernels/pointwise.h"

namespace tandem::kernels::math {

TANDEM_HD float texp(float x) { return expf(x); }
TANDEM_HD double texp(double x) { return exp(x); }
TANDEM_HD float tlog(float x) { return logf(x); }
TANDEM_HD double tlog(double x) { return log(x); }
TANDEM_HD float ttanh(float x) { return tanhf(x); }
TANDEM_HD double ttanh(double x) { return tanh(x); }
TANDEM_HD float terf(float x) { return erff(x); }
TANDEM_HD double terf(double x) { return erf(x); }
TANDEM_HD float tpow(float a, float b) { return powf(a, b); }
TANDEM_HD double tpow(double a, double b) { return pow(a, b); }
template <typename T> TANDEM_HD bool tisnan(T x) { return x != x; }

template <typename T>
TANDEM_HD T apply_binary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Pow: return tpow(a, b);
    case BinaryOp::Maximum: return (tisnan(a) || a > b) ? a : b;  // NaN propagates, as PyTorch
    case BinaryOp::Minimum: return (tisnan(a) || a < b) ? a : b;
  }
  return a;
}

// d(a op b)/da (which == 0) or /db, times g.
template <typename T>
TANDEM_HD T apply_binary_grad(BinaryOp op, int which, T g, T a, T b, T y) {
  switch (op) {
    case BinaryOp::Add: return g;
    case BinaryOp::Sub: return which == 0 ? g : -g;
    case BinaryOp::Mul: return which == 0 ? g * b : g * a;
    case BinaryOp::Div: return which == 0 ? g / b : -g * y / b;
    case BinaryOp::Pow:
      if (which == 0) return b == T(0) ? T(0) : g * b * tpow(a, b - T(1));
      return (a == T(0) && b >= T(0)) ? T(0) : g * y * tlog(a);
    case BinaryOp::Maximum:
    case BinaryOp::Minimum: {
      // PyTorch's rule: ties split the gradient; an operand gets none only where it strictly loses, so
      // where a NaN is involved (no order) both operands get all of it.
      if (a == b) return g / T(2);
      const T mine = which == 0 ? a : b, other = which == 0 ? b : a;
      const bool loses = op == BinaryOp::Maximum ? mine < other : mine > other;
      return loses ? T(0) : g;
    }
  }
  return g;
}

template <typename T>
TANDEM_HD bool apply_compare(CompareOp op, T a, T b) {
  switch (op) {
    case CompareOp::Eq: return a == b;
    case CompareOp::Ne: return a != b;
    case CompareOp::Lt: return a < b;
    case CompareOp::Le: return a <= b;
    case CompareOp::Gt: return a > b;
    case CompareOp::Ge: return a >= b;
  }
  return false;
}

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluKappa = 0.044715;

template <typename T>
TANDEM_HD T sigmoid(T x) {
  return T(1) / (T(1) + texp(-x));
}

template <typename T>
TANDEM_HD T apply_unary(UnaryOp op, T x) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return texp(x);
    case UnaryOp::Log: return tlog(x);
    case UnaryOp::Sqrt: return tsqrt(x);
    case UnaryOp::Rsqrt: return T(1) / tsqrt(x);
    case UnaryOp::Tanh: return ttanh(x);
    case UnaryOp::Sigmoid: return sigmoid(x);
    case UnaryOp::Relu: return x > T(0) ? x : (tisnan(x) ? x : T(0));
    case UnaryOp::Gelu: return x * T(0.5) * (T(1) + terf(x * T(kSqrt1_2)));
    case UnaryOp::GeluTanh:
      return T(0.5) * x * (T(1) + ttanh(T(kSqrt2OverPi) * (x + T(kGeluKappa) * x * x * x)));
    case UnaryOp::Silu: return x * sigmoid(x);
    case UnaryOp::Abs: return x < T(0) ? -x : (x == T(0) ? T(0) : x);  // -0 -> 0, NaN stays NaN
  }
  return x;
}

// grad * d op(x)/dx from x and the forward output y.
template <typename T>
TANDEM_HD T apply_unary_grad(UnaryOp op, T g, T x, T y) {
  switch (op) {
    case UnaryOp::Neg: return -g;
    case UnaryOp::Exp: return g * y;
    case UnaryOp::Log: return g / x;
    case UnaryOp::Sqrt: return g / (T(2) * y);
    case UnaryOp::Rsqrt: return T(-0.5) * g * y * y * y;
    case UnaryOp::Tanh: return g * (T(1) - y * y);
    case UnaryOp::Sigmoid: return g * y * (T(1) - y);
    case UnaryOp::Relu: return y <= T(0) ? T(0) : g;  // NaN passes its gradient, as threshold_backward
    case UnaryOp::Gelu: {
      const T cdf = T(0.5) * (T(1) + terf(x * T(kSqrt1_2)));
      const T pdf = T(kInvSqrt2Pi) * texp(T(-0.5) * x * x);
      return g * (cdf + x * pdf);
    }
    case UnaryOp::GeluTanh: {
      const T x2 = x * x;
      const T t = ttanh(T(kSqrt2OverPi) * (x + T(kGeluKappa) * x2 * x));
      const T left = T(0.5) * (T(1) + t);
      const T right = T(0.5) * x * (T(1) - t * t) * T(kSqrt2OverPi) * (T(1) + T(3 * kGeluKappa) * x2);
      return g * (left + right);
    }
    case UnaryOp::Silu: {
      const T s = sigmoid(x);
      return g * s * (T(1) + x * (T(1) - s));
    }
    case UnaryOp::Abs: return x > T(0) ? g : (x < T(0) ? -g : g * T(0));  // g * sign(x), sign(0) = sign(NaN) = 0

  }
  return g;
}

// The dropout mask's value for a uniform draw u in [0, 1): 0 with probability p, else keep.
template <typename T>
TANDEM_HD T dropout_value(double u, double p, T keep) {
  return u < p ? T(0) : keep;
}

// The CUDA dropout's counter-based generator. splitmix64's output function: a bijective mix of a
// 64-bit counter, so (seed + k * gamma) gives each k its own independent-looking 64 bits (Steele,
// Lea, Flood: SplittableRandom).
constexpr uint64_t kSplitmixGamma = 0x9e3779b97f4a7c15ull;
TANDEM_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The seed of one mask. Eager (`replay` null): the Generator's draw itself. Replayed from a CUDA
// graph (`replay` points at the graph's replay counter, core/cuda/context.h): the draw made at
// capture starts a splitmix64 sequence and replay r takes its element r, so each replay draws a
// new mask, every seed as well mixed as a Generator draw.
TANDEM_HD uint64_t dropout_seed(uint64_t draw, const uint64_t* replay) {
  return replay == nullptr ? draw : mix64(draw + (*replay + 1) * kSplitmixGamma);
}

// Element i's uniform draw in [0, 1) under `seed`: 53 bits, as Generator::uniform.
TANDEM_HD double dropout_uniform(uint64_t seed, int64_t i) {
  const uint64_t bits = mix64(seed + (static_cast<uint64_t>(i) + 1) * kSplitmixGamma);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace tandem::kernels::math
