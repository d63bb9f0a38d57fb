// SyncBatchNorm's forward, backward node and convert_sync_batchnorm (see the
// header for the semantics). Per-channel vectors are combined on the host in
// double; the per-element work is done by the batch_norm kernels on x's
// device: local moments by a training forward into scratch running stats
// (momentum 1), the output by an eval forward with the global statistics, the
// local gradient sums and grad_out * w * invstd by the backward kernel, and
// the per-channel affine correction by another eval forward.
#include "dist/parallel/sync_batch_norm.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "dist/group/host_values.h"
#include "kernels/batch_norm.h"
#include "kernels/pointwise.h"
#include "nn/functional.h"

namespace tandem::dist {
namespace {

// [C] tensor of `dtype` on `device` from host doubles.
Tensor channel_tensor(const std::vector<double>& v, DType dtype, Device device) {
  Tensor host = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  return host.to(dtype).to(device);
}

// The per-channel vectors travel through dist/group/host_values.h, on the group's device.
const char* kSameOrder = " (every rank must run the same synced layers in the same order)";

struct SyncBatchNormBackward final : Node {
  Tensor x, w, mean, var, invstd;  // mean/var/invstd: the global statistics used, x's dtype
  double eps = 1e-5;
  double count = 0;  // elements per channel over all ranks
  DType input_dtype = kFloat32;  // f16/bf16 inputs are computed in f32; their gradient goes back cast
  std::shared_ptr<ProcessGroup> group;

  std::string name() const override { return "SyncBatchNormBackward"; }

  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const bool need_input = needs_input_grad(0), need_weight = needs_input_grad(1),
               need_bias = needs_input_grad(2);
    // Every rank must join the allreduce below, so a missing gradient counts as zeros.
    Tensor gy = g[0].defined() ? g[0] : Tensor::zeros(x.shape(), x.dtype(), x.device());
    // Local sum(gy * xhat) (as "weight") and sum(gy) (as "bias") with the global statistics.
    auto sums = kernels::batch_norm_backward(gy, x, w, mean, invstd, /*training=*/true, false, true, true);
    std::vector<Tensor> out(3);
    if (need_weight) out[1] = sums.weight;
    if (need_bias) out[2] = sums.bias;
    if (!need_input) return out;

    const int64_t C = x.size(1);
    const auto sum_dy_xhat = sums.weight.to_vector<double>(), sum_dy = sums.bias.to_vector<double>();
    std::vector<double> packed(2 * C);
    for (int64_t c = 0; c < C; ++c) {
      packed[c] = sum_dy[c];
      packed[C + c] = sum_dy_xhat[c];
    }
    packed = allreduce_values(*group, packed, ReduceOp::Sum,
                              std::string("SyncBatchNorm: the allreduce of the gradient sums") + kSameOrder);

    // grad_input = w * invstd * (gy - S_dy / N - xhat * S_dy_xhat / N)
    //            = [gy * w * invstd]  +  [xhat * a + b]   with per-channel a, b.
    const auto wv = w.defined() ? w.to_vector<double>() : std::vector<double>(C, 1.0);
    const auto iv = invstd.to_vector<double>();
    std::vector<double> a(C), b(C);
    for (int64_t c = 0; c < C; ++c) {
      const double scale = wv[c] * iv[c] / count;
      a[c] = -scale * packed[C + c];
      b[c] = -scale * packed[c];
    }
    Tensor direct = kernels::batch_norm_backward(gy, x, w, mean, invstd, /*training=*/false, true, false, false)
                        .input;
    Tensor correction = kernels::batch_norm_forward(x, channel_tensor(a, x.dtype(), x.device()),
                                                    channel_tensor(b, x.dtype(), x.device()), mean, var,
                                                    /*training=*/false, 0.0, eps)
                            .output;
    out[0] = kernels::binary(kernels::BinaryOp::Add, direct, correction);
    if (out[0].dtype() != input_dtype) out[0] = out[0].to(input_dtype);
    return out;
  }
};

}  // namespace

SyncBatchNormStats::SyncBatchNormStats(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {
  TANDEM_CHECK(group_ != nullptr, "SyncBatchNorm: the process group is null");
}

std::string SyncBatchNormStats::name() const {
  return "SyncBatchNorm(" + group_->backend() + ", " + std::to_string(group_->size()) + " ranks)";
}

Tensor SyncBatchNormStats::forward(nn::BatchNorm2d& bn, const Tensor& x_in) {
  TANDEM_CHECK(x_in.defined() && x_in.dim() >= 2 && x_in.size(1) == bn.num_features, "SyncBatchNorm(",
               bn.num_features, "): expected input [N, ", bn.num_features, ", ...], got ",
               x_in.defined() ? x_in.str() : "an undefined tensor");
  if (group_->size() == 1) {
    return F::batch_norm(x_in, bn.running_mean, bn.running_var, bn.weight, bn.bias, true, bn.momentum, bn.eps);
  }
  // As F::batch_norm under mixed precision: f16/bf16 inputs are normalised in f32.
  const bool low_precision = x_in.dtype() == kFloat16 || x_in.dtype() == kBFloat16;
  const Tensor x = low_precision ? x_in.to(kFloat32) : x_in;
  const int64_t C = bn.num_features;
  const int64_t M = C == 0 ? 0 : x.numel() / C;  // this rank's values per channel

  // This rank's [mean(C), biased var(C), count] in double.
  std::vector<double> local(2 * C + 1, 0.0);
  local[2 * C] = static_cast<double>(M);
  if (M > 1) {
    Tensor m = Tensor::zeros({C}, x.dtype(), x.device()), v = Tensor::zeros({C}, x.dtype(), x.device());
    kernels::batch_norm_forward(x, Tensor(), Tensor(), m, v, /*training=*/true, /*momentum=*/1.0, bn.eps);
    const auto mv = m.to_vector<double>(), uv = v.to_vector<double>();  // v holds the unbiased variance
    for (int64_t c = 0; c < C; ++c) {
      local[c] = mv[c];
      local[C + c] = uv[c] * double(M - 1) / double(M);
    }
  } else if (M == 1) {
    const auto xv = x.to_vector<double>();
    for (int64_t c = 0; c < C; ++c) local[c] = xv[c];
  }

  const int W = group_->size();
  const std::vector<std::vector<double>> ranks = allgather_values(
      *group_, local, std::string("SyncBatchNorm: the allgather of the batch statistics") + kSameOrder);
  double N = 0;
  for (int r = 0; r < W; ++r) N += ranks[r][2 * C];
  TANDEM_CHECK(N > 1, "SyncBatchNorm(", C, "): expected more than 1 value per channel over all ranks when "
               "training, got ", N, " (this rank's input ", x.str(), ")");
  std::vector<double> mean(C, 0.0), var(C, 0.0);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int r = 0; r < W; ++r) s += ranks[r][2 * C] * ranks[r][c];
    mean[c] = s / N;
    double q = 0;
    for (int r = 0; r < W; ++r) {
      const double d = ranks[r][c] - mean[c];
      q += ranks[r][2 * C] * (ranks[r][C + c] + d * d);
    }
    var[c] = q / N;
  }

  // Running statistics: momentum towards the global mean and unbiased variance.
  if (bn.running_mean.defined() && bn.running_var.defined()) {
    auto rm = bn.running_mean.to_vector<double>(), rv = bn.running_var.to_vector<double>();
    for (int64_t c = 0; c < C; ++c) {
      rm[c] = (1.0 - bn.momentum) * rm[c] + bn.momentum * mean[c];
      rv[c] = (1.0 - bn.momentum) * rv[c] + bn.momentum * var[c] * N / (N - 1);
    }
    bn.running_mean.copy_(Tensor::from_vector(rm, {C}));
    bn.running_var.copy_(Tensor::from_vector(rv, {C}));
  }

  Tensor mean_t = channel_tensor(mean, x.dtype(), x.device());
  Tensor var_t = channel_tensor(var, x.dtype(), x.device());
  auto r = kernels::batch_norm_forward(x, bn.weight, bn.bias, mean_t, var_t, /*training=*/false, 0.0, bn.eps);
  if (autograd::any_requires_grad({x_in, bn.weight, bn.bias})) {
    auto n = std::make_shared<SyncBatchNormBackward>();
    n->x = x.detach();
    n->w = bn.weight.defined() ? bn.weight.detach() : Tensor();
    n->mean = r.save_mean;
    n->var = var_t;
    n->invstd = r.save_invstd;
    n->eps = bn.eps;
    n->count = N;
    n->group = group_;
    n->input_dtype = x_in.dtype();
    autograd::record(n, {x_in, bn.weight, bn.bias}, {&r.output});
  }
  return r.output;
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, std::shared_ptr<ProcessGroup> group, double eps,
                             double momentum)
    : nn::BatchNorm2d(num_features, eps, momentum) {
  set_stats_sync(std::make_shared<SyncBatchNormStats>(std::move(group)));
}

namespace {
int convert(nn::Module& m, const std::shared_ptr<SyncBatchNormStats>& sync) {
  int n = 0;
  if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(&m)) {
    bn->set_stats_sync(sync);
    ++n;
  }
  for (auto& [name, child] : m.children()) n += convert(*child, sync);
  return n;
}
}  // namespace

int convert_sync_batchnorm(nn::Module& root, std::shared_ptr<ProcessGroup> group) {
  // One strategy object shared by all layers: it holds only the group.
  return convert(root, std::make_shared<SyncBatchNormStats>(std::move(group)));
}

}  // namespace tandem::dist
