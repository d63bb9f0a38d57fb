// batch_norm over the channel dimension of x [N, C, ...] on CUDA, with custom kernels (they cover
// BatchNorm1d/2d, affine=false and eval-mode backward, which cuDNN's spatial BN does not all do).
// Semantics as PyTorch's:
//  - training: batch mean and biased variance over N and the spatial positions (M values per
//    channel); save_invstd = 1 / sqrt(var + eps); running_mean = (1 - momentum) * running_mean +
//    momentum * mean and running_var likewise with the UNBIASED variance var * M / (M - 1);
//  - eval: normalise with the running statistics; save_mean/save_invstd are those statistics;
//  - backward: the usual batch-statistics gradient in training, the affine map's in eval.
// Statistics use two passes (mean, then squared deviations) with double accumulation; each channel's
// values are split over several blocks (a [C, parts] grid, parts_for) whose double partial sums a
// thread per channel adds in order, so the result depends only on the shape. Inputs may be strided
// (made contiguous first); outputs are contiguous. All work is on the compute stream; nothing waits
// for the device (the scratch buffers go back to the caching allocator, which orders their reuse
// by the stream).
#include "kernels/ops.h"

#include <algorithm>

#include "core/cuda/launch.cuh"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// The M = N * S values of a channel are split into `parts` ranges, each reduced by one block of a [C, parts]
// grid into a double partial sum; a thread per channel then adds the parts in order. Enough blocks to fill the
// device even with few channels (a block per channel left most SMs idle), and deterministic: the split
// depends only on the shape.
int64_t parts_for(int64_t C, int64_t m) {
  const int64_t want_blocks = 1024, min_per_block = int64_t{kThreads} * 8;
  const int64_t by_blocks = (want_blocks + C - 1) / C, by_size = (m + min_per_block - 1) / min_per_block;
  return std::max<int64_t>(1, std::min<int64_t>({by_blocks, by_size, 65535}));
}

// Walks the values [lo, hi) of channel c, each thread its own, handing each value's element index to f.
// The (n, s) position advances by blockDim.x without a division per element.
template <typename F>
__device__ __forceinline__ void for_channel_range(int64_t c, int64_t C, int64_t S, int64_t lo, int64_t hi, F f) {
  int64_t i = lo + threadIdx.x;
  if (i >= hi) return;
  int64_t n = i / S, s = i - n * S;
  const int64_t step_n = blockDim.x / S, step_s = blockDim.x - step_n * S;
  for (; i < hi; i += blockDim.x) {
    f((n * C + c) * S + s);
    n += step_n;
    s += step_s;
    if (s >= S) {
      s -= S;
      ++n;
    }
  }
}

__device__ __forceinline__ int64_t range_start(int64_t part, int64_t parts, int64_t m) { return part * m / parts; }

// Channel c's parts added in order: partial[(c * parts + p) * width + k] over p.
__device__ __forceinline__ double sum_parts(const double* partial, int64_t c, int64_t parts, int width = 1, int k = 0) {
  double s = 0;
  for (int64_t p = 0; p < parts; ++p) s += partial[(c * parts + p) * width + k];
  return s;
}

// partial[c * parts + p] = sum over part p of channel c of (x - shift[c])^k, k = 1 without shift, 2 with it.
__global__ void channel_partials_kernel(const float* x, const double* shift, int64_t C, int64_t S, int64_t m,
                                        int64_t parts, double* partial) {
  const int64_t c = blockIdx.x, p = blockIdx.y;
  const double mu = shift ? shift[c] : 0.0;
  double acc = 0;
  for_channel_range(c, C, S, range_start(p, parts, m), range_start(p + 1, parts, m), [&](int64_t k) {
    const double d = double(x[k]) - mu;
    acc += shift ? d * d : d;
  });
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[c * parts + p] = acc;
}

// mean[c] = the parts' sum / M.
__global__ void channel_mean_kernel(const double* partial, int64_t parts, int64_t C, int64_t m, double* mean) {
  TANDEM_GRID_STRIDE_LOOP(c, C) { mean[c] = sum_parts(partial, c, parts) / double(m); }
}

// From the parts of the squared deviations: the saved statistics and the running ones.
__global__ void channel_stats_kernel(const double* partial, const double* mean_d, int64_t parts, int64_t C, int64_t m,
                                     double eps, double momentum, float* save_mean, float* save_invstd,
                                     float* running_mean, float* running_var) {
  TANDEM_GRID_STRIDE_LOOP(c, C) {
    const double mean = mean_d[c], var = sum_parts(partial, c, parts) / double(m);
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

// y = (x - mean) * invstd * weight + bias; weight/bias null means 1/0. I: the index type, 32-bit whenever the
// tensor allows it (the channel of an element costs a division and a remainder in I).
template <typename I>
__global__ void normalize_kernel(const float* x, const float* mean, const float* invstd, const float* weight,
                                 const float* bias, float* y, I C, I S, I n) {
  for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    const I c = (i / S) % C;
    const float w = weight ? weight[c] : 1.0f, b = bias ? bias[c] : 0.0f;
    y[i] = (x[i] - mean[c]) * (invstd[c] * w) + b;
  }
}

// Per channel and part: sum(dy) and sum(dy * (x - mean)), into partial[(c * parts + p) * 2 + {0, 1}].
__global__ void grad_partials_kernel(const float* dy, const float* x, const float* mean, int64_t C, int64_t S,
                                     int64_t m, int64_t parts, double* partial) {
  const int64_t c = blockIdx.x, p = blockIdx.y;
  const double mu = mean[c];
  double a = 0, b = 0;
  for_channel_range(c, C, S, range_start(p, parts, m), range_start(p + 1, parts, m), [&](int64_t k) {
    const double g = dy[k];
    a += g;
    b += g * (double(x[k]) - mu);
  });
  a = block_sum(a);
  b = block_sum(b);
  if (threadIdx.x == 0) {
    partial[(c * parts + p) * 2] = a;
    partial[(c * parts + p) * 2 + 1] = b;
  }
}

// sum_dy[c], sum_dy_xmu[c]: the parts added in order.
__global__ void grad_sums_kernel(const double* partial, int64_t parts, int64_t C, float* sum_dy, float* sum_dy_xmu) {
  TANDEM_GRID_STRIDE_LOOP(c, C) {
    sum_dy[c] = static_cast<float>(sum_parts(partial, c, parts, 2, 0));
    sum_dy_xmu[c] = static_cast<float>(sum_parts(partial, c, parts, 2, 1));
  }
}

// training: dx = (dy - sum_dy / M - (x - mean) * invstd^2 * sum_dy_xmu / M) * invstd * w
// eval:     dx = dy * invstd * w
template <typename I>
__global__ void grad_input_kernel(const float* dy, const float* x, const float* mean, const float* invstd,
                                  const float* weight, const float* sum_dy, const float* sum_dy_xmu, int training,
                                  float* dx, I C, I S, int64_t m, I n) {
  for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    const I c = (i / S) % C;
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

const float* ptr_or_null(const Tensor& t) { return t.defined() ? f32_ptr(t) : nullptr; }

struct Dims {
  int64_t N, C, S;
};

// Elementwise kernels index in 32 bits when every index fits (grid-stride steps included).
bool fits_u32(int64_t n) { return n <= int64_t{0x7fffffff}; }

void launch_normalize(const StreamGuard& on, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                      const Tensor& weight, const Tensor& bias, const Tensor& y, const Dims& d, int64_t n) {
  if (fits_u32(n)) {
    launch(on, normalize_kernel<uint32_t>, grid_for(n), kThreads, 0, f32_ptr(x), f32_ptr(mean), f32_ptr(invstd),
           ptr_or_null(weight), ptr_or_null(bias), f32_ptr(y), uint32_t(d.C), uint32_t(d.S), uint32_t(n));
  } else {
    launch(on, normalize_kernel<int64_t>, grid_for(n), kThreads, 0, f32_ptr(x), f32_ptr(mean), f32_ptr(invstd),
           ptr_or_null(weight), ptr_or_null(bias), f32_ptr(y), d.C, d.S, n);
  }
}

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
    if (d.C > 0) {  // two passes over x (mean, then squared deviations), each split over parts
      const int64_t parts = parts_for(d.C, m);
      Tensor scratch = Tensor::empty({d.C * (parts + 1)}, kFloat64, device);
      double* partial = static_cast<double*>(scratch.raw_data());
      double* mean_d = partial + d.C * parts;
      const dim3 grid(static_cast<unsigned>(d.C), static_cast<unsigned>(parts));
      launch(on, channel_partials_kernel, grid, kThreads, 0, f32_ptr(x), static_cast<const double*>(nullptr), d.C, d.S,
             m, parts, partial);
      launch(on, channel_mean_kernel, grid_for(d.C), kThreads, 0, static_cast<const double*>(partial), parts, d.C, m,
             mean_d);
      launch(on, channel_partials_kernel, grid, kThreads, 0, f32_ptr(x), static_cast<const double*>(mean_d), d.C, d.S,
             m, parts, partial);
      launch(on, channel_stats_kernel, grid_for(d.C), kThreads, 0, static_cast<const double*>(partial),
             static_cast<const double*>(mean_d), parts, d.C, m, eps, momentum, f32_ptr(out.save_mean),
             f32_ptr(out.save_invstd), running_mean.defined() ? f32_ptr(running_mean) : nullptr,
             running_var.defined() ? f32_ptr(running_var) : nullptr);
    }
    if (n > 0) {
      launch_normalize(on, x, out.save_mean, out.save_invstd, weight, bias, out.output, d, n);
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
    launch_normalize(on, x, out.save_mean, out.save_invstd, weight, bias, out.output, d, n);
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
      const int64_t parts = parts_for(d.C, m);
      Tensor scratch = Tensor::empty({d.C * parts * 2}, kFloat64, device);
      double* partial = static_cast<double*>(scratch.raw_data());
      launch(on, grad_partials_kernel, dim3(static_cast<unsigned>(d.C), static_cast<unsigned>(parts)), kThreads, 0,
             f32_ptr(dy), f32_ptr(x), f32_ptr(save_mean), d.C, d.S, m, parts, partial);
      launch(on, grad_sums_kernel, grid_for(d.C), kThreads, 0, static_cast<const double*>(partial), parts, d.C,
             f32_ptr(sums), f32_ptr(sums) + d.C);
    }
  }
  if (need_input) {
    grads.input = Tensor::empty(x_in.shape(), kFloat32, device);
    if (n > 0) {
      const float* s_dy = need_sums ? f32_ptr(sums) : nullptr;
      const float* s_dy_xmu = need_sums ? f32_ptr(sums) + d.C : nullptr;
      if (fits_u32(n)) {
        launch(on, grad_input_kernel<uint32_t>, grid_for(n), kThreads, 0, f32_ptr(dy), f32_ptr(x), f32_ptr(save_mean),
               f32_ptr(save_invstd), ptr_or_null(weight), s_dy, s_dy_xmu, training ? 1 : 0, f32_ptr(grads.input),
               uint32_t(d.C), uint32_t(d.S), m, uint32_t(n));
      } else {
        launch(on, grad_input_kernel<int64_t>, grid_for(n), kThreads, 0, f32_ptr(dy), f32_ptr(x), f32_ptr(save_mean),
               f32_ptr(save_invstd), ptr_or_null(weight), s_dy, s_dy_xmu, training ? 1 : 0, f32_ptr(grads.input), d.C,
               d.S, m, n);
      }
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
