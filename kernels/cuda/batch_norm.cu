// batch_norm over the channel dimension of x [N, C, ...] on CUDA, with custom kernels (they cover
// BatchNorm1d/2d, affine=false and eval-mode backward, which cuDNN's spatial BN does not all do).
// Semantics as PyTorch's:
//  - training: batch mean and biased variance over N and the spatial positions (M values per
//    channel); save_invstd = 1 / sqrt(var + eps); running_mean = (1 - momentum) * running_mean +
//    momentum * mean and running_var likewise with the UNBIASED variance var * M / (M - 1);
//  - eval: normalise with the running statistics; save_mean/save_invstd are those statistics;
//  - backward: the usual batch-statistics gradient in training, the affine map's in eval.
// Statistics use two passes (mean, then squared deviations) with double accumulation; one block
// per channel. Inputs may be strided (made contiguous first); outputs are contiguous. All work is
// on the compute stream; nothing waits for the device.
#include "kernels/batch_norm.h"
#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t at(int64_t i, int64_t c, int64_t C, int64_t S) {
  const int64_t n = i / S, s = i - n * S;  // i runs over the M = N * S values of channel c
  return (n * C + c) * S + s;
}

__global__ void stats_kernel(const float* x, int64_t N, int64_t C, int64_t S, double eps, double momentum,
                             float* save_mean, float* save_invstd, float* running_mean, float* running_var) {
  const int64_t c = blockIdx.x, m = N * S;
  double acc = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) acc += x[at(i, c, C, S)];
  const double mean = block_sum(acc) / double(m);
  acc = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const double d = x[at(i, c, C, S)] - mean;
    acc += d * d;
  }
  const double var = block_sum(acc) / double(m);
  if (threadIdx.x == 0) {
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = static_cast<float>(1.0 / sqrt(var + eps));
    if (running_mean) running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    if (running_var) {
      const double unbiased = var * double(m) / double(m - 1);
      running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
}

__global__ void invstd_kernel(const float* var, double eps, float* invstd, int64_t C) {
  TANDEM_GRID_STRIDE_LOOP(c, C) { invstd[c] = static_cast<float>(1.0 / sqrt(double(var[c]) + eps)); }
}

// y = (x - mean) * invstd * weight + bias; weight/bias null means 1/0.
__global__ void normalize_kernel(const float* x, const float* mean, const float* invstd, const float* weight,
                                 const float* bias, float* y, int64_t C, int64_t S, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const int64_t c = (i / S) % C;
    const float w = weight ? weight[c] : 1.0f, b = bias ? bias[c] : 0.0f;
    y[i] = (x[i] - mean[c]) * (invstd[c] * w) + b;
  }
}

// Per channel: sum_dy = sum(dy), sum_dy_xmu = sum(dy * (x - mean)).
__global__ void grad_sums_kernel(const float* dy, const float* x, const float* mean, int64_t N, int64_t C, int64_t S,
                                 float* sum_dy, float* sum_dy_xmu) {
  const int64_t c = blockIdx.x, m = N * S;
  const double mu = mean[c];
  double a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const int64_t k = at(i, c, C, S);
    const double g = dy[k];
    a += g;
    b += g * (double(x[k]) - mu);
  }
  a = block_sum(a);
  b = block_sum(b);
  if (threadIdx.x == 0) {
    sum_dy[c] = static_cast<float>(a);
    sum_dy_xmu[c] = static_cast<float>(b);
  }
}

// training: dx = (dy - sum_dy / M - (x - mean) * invstd^2 * sum_dy_xmu / M) * invstd * w
// eval:     dx = dy * invstd * w
__global__ void grad_input_kernel(const float* dy, const float* x, const float* mean, const float* invstd,
                                  const float* weight, const float* sum_dy, const float* sum_dy_xmu, int training,
                                  float* dx, int64_t C, int64_t S, int64_t m, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const int64_t c = (i / S) % C;
    const float is = invstd[c], w = weight ? weight[c] : 1.0f;
    if (training) {
      const float inv_m = 1.0f / static_cast<float>(m);
      const float mean_dy = sum_dy[c] * inv_m;
      const float proj = sum_dy_xmu[c] * inv_m * is * is;
      dx[i] = (dy[i] - mean_dy - (x[i] - mean[c]) * proj) * is * w;
    } else {
      dx[i] = dy[i] * is * w;
    }
  }
}

__global__ void scale_by_kernel(float* v, const float* by, int64_t C) {
  TANDEM_GRID_STRIDE_LOOP(c, C) { v[c] *= by[c]; }
}

struct Dims {
  int64_t N, C, S;
};

Dims dims_of(const char* op, const Tensor& x) {
  TANDEM_CHECK(x.dim() >= 2, op, ": input must be [N, C, ...], got ", x.str());
  Dims d{x.size(0), x.size(1), 1};
  for (int64_t i = 2; i < x.dim(); ++i) d.S *= x.size(i);
  TANDEM_CHECK(d.C <= 0x7fffffff, op, ": ", d.C, " channels exceed the grid limit");
  return d;
}

void check_channel_vector(const char* op, const char* name, const Tensor& t, int64_t C) {
  if (!t.defined()) return;
  TANDEM_CHECK(t.dim() == 1 && t.size(0) == C, op, ": ", name, " must be [", C, "], got ", t.str());
  TANDEM_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got ", t.str());
}

const float* ptr_or_null(const Tensor& t) { return t.defined() ? f32_ptr(t) : nullptr; }

}  // namespace

BatchNormForward batch_norm_forward(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                                    const Tensor& running_mean, const Tensor& running_var, bool training,
                                    double momentum, double eps) {
  const char* op = "batch_norm_forward";
  const int dev = check_f32_cuda(op, {x_in, weight, bias, running_mean, running_var});
  const Dims d = dims_of(op, x_in);
  check_channel_vector(op, "weight", weight, d.C);
  check_channel_vector(op, "bias", bias, d.C);
  check_channel_vector(op, "running_mean", running_mean, d.C);
  check_channel_vector(op, "running_var", running_var, d.C);
  TANDEM_CHECK(eps > 0, op, ": eps must be positive, got ", eps);
  const Device device = x_in.device();
  const int64_t m = d.N * d.S, n = x_in.numel();
  BatchNormForward out;
  out.output = Tensor::empty(x_in.shape(), kFloat32, device);
  if (training) {
    TANDEM_CHECK(m > 1, op, ": expected more than 1 value per channel when training, got input ", x_in.str());
    const Tensor x = x_in.contiguous();
    out.save_mean = Tensor::empty({d.C}, kFloat32, device);
    out.save_invstd = Tensor::empty({d.C}, kFloat32, device);
    StreamGuard on(dev);
    if (d.C > 0) {
      launch(on, stats_kernel, static_cast<unsigned>(d.C), kThreads, 0,  f32_ptr(x), d.N, d.C, d.S, eps, momentum, f32_ptr(out.save_mean), f32_ptr(out.save_invstd), running_mean.defined() ? f32_ptr(running_mean) : nullptr, running_var.defined() ? f32_ptr(running_var) : nullptr);
    }
    if (n > 0) {
      launch(on, normalize_kernel, grid_for(n), kThreads, 0, f32_ptr(x), f32_ptr(out.save_mean), f32_ptr(out.save_invstd), ptr_or_null(weight), ptr_or_null(bias), f32_ptr(out.output), d.C, d.S, n);
    }
    return out;
  }
  TANDEM_CHECK(running_mean.defined() && running_var.defined(), op,
               ": eval mode needs running_mean and running_var");
  const Tensor x = x_in.contiguous();
  out.save_mean = running_mean.clone();
  out.save_invstd = Tensor::empty({d.C}, kFloat32, device);
  StreamGuard on(dev);
  if (d.C > 0) {
    launch(on, invstd_kernel, grid_for(d.C), kThreads, 0, f32_ptr(running_var), eps, f32_ptr(out.save_invstd), d.C);
  }
  if (n > 0) {
    launch(on, normalize_kernel, grid_for(n), kThreads, 0, f32_ptr(x), f32_ptr(out.save_mean), f32_ptr(out.save_invstd), ptr_or_null(weight), ptr_or_null(bias), f32_ptr(out.output), d.C, d.S, n);
  }
  return out;
}

BatchNormGrads batch_norm_backward(const Tensor& grad_out_in, const Tensor& x_in, const Tensor& weight,
                                   const Tensor& save_mean, const Tensor& save_invstd, bool training,
                                   bool need_input, bool need_weight, bool need_bias) {
  const char* op = "batch_norm_backward";
  const int dev = check_f32_cuda(op, {grad_out_in, x_in, weight, save_mean, save_invstd});
  const Dims d = dims_of(op, x_in);
  TANDEM_CHECK(grad_out_in.shape() == x_in.shape(), op, ": grad_output ", grad_out_in.str(), " does not match input ",
               x_in.str());
  check_channel_vector(op, "weight", weight, d.C);
  TANDEM_CHECK(save_mean.defined() && save_invstd.defined(), op, ": save_mean and save_invstd are required");
  check_channel_vector(op, "save_mean", save_mean, d.C);
  check_channel_vector(op, "save_invstd", save_invstd, d.C);
  const Device device = x_in.device();
  const int64_t m = d.N * d.S, n = x_in.numel();
  const Tensor dy = grad_out_in.contiguous(), x = x_in.contiguous();
  BatchNormGrads grads;
  // Per-channel sums, needed by the weight/bias gradients and by the training-mode input gradient.
  const bool need_sums = need_weight || need_bias || (need_input && training);
  Tensor sums;  // [2, C]: sum_dy, then sum_dy_xmu
  StreamGuard on(dev);
  if (need_sums) {
    sums = Tensor::empty({2, d.C}, kFloat32, device);
    if (m == 0) {
      sums.zero_();
    } else if (d.C > 0) {
      launch(on, grad_sums_kernel, static_cast<unsigned>(d.C), kThreads, 0,  f32_ptr(dy), f32_ptr(x), f32_ptr(save_mean), d.N, d.C, d.S, f32_ptr(sums), f32_ptr(sums) + d.C);
    }
  }
  if (need_input) {
    grads.input = Tensor::empty(x_in.shape(), kFloat32, device);
    if (n > 0) {
      launch(on, grad_input_kernel, grid_for(n), kThreads, 0,  f32_ptr(dy), f32_ptr(x), f32_ptr(save_mean), f32_ptr(save_invstd), ptr_or_null(weight), need_sums ? f32_ptr(sums) : nullptr, need_sums ? f32_ptr(sums) + d.C : nullptr, training ? 1 : 0, f32_ptr(grads.input), d.C, d.S, m, n);
    }
  }
  if (need_weight) {  // sum(dy * (x - mean)) * invstd
    grads.weight = sums.select(0, 1).clone();
    if (d.C > 0) {
      launch(on, scale_by_kernel, grid_for(d.C), kThreads, 0, f32_ptr(grads.weight), f32_ptr(save_invstd), d.C);
    }
  }
  if (need_bias) grads.bias = sums.select(0, 0).clone();
  return grads;
}

}  // namespace tandem::kernels::cuda
