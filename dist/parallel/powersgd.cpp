// PowerSGD (dist/parallel/powersgd.h). P and Q are orthonormalised where they live: a host bucket's on the
// host in double (the results the PyTorch fixtures were checked with), a CUDA bucket's with the
// engine's tensor ops on its device, so backward never waits for the GPU here.
#include "dist/parallel/powersgd.h"

#include <cmath>
#include <vector>

#include "kernels/linear.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"

namespace tandem::dist {
namespace {

// Gram-Schmidt on the columns of a [rows, cols] host matrix, in place, accumulating in double.
void orthogonalize_on_host(Tensor& m) {
  const int64_t rows = m.size(0), cols = m.size(1);
  float* a = m.data<float>();
  for (int64_t c = 0; c < cols; ++c) {
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i) norm += double(a[i * cols + c]) * a[i * cols + c];
    norm = std::sqrt(norm);
    if (norm > 0)
      for (int64_t i = 0; i < rows; ++i) a[i * cols + c] = static_cast<float>(a[i * cols + c] / norm);
    for (int64_t k = c + 1; k < cols; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += double(a[i * cols + c]) * a[i * cols + k];
      for (int64_t i = 0; i < rows; ++i) a[i * cols + k] = static_cast<float>(a[i * cols + k] - dot * a[i * cols + c]);
    }
  }
}

void orthogonalize(Tensor& m) {
  if (m.device().is_cpu()) {
    orthogonalize_on_host(m);
  } else {
    orthogonalize_with_tensor_ops(m);
  }
}

struct Compressed {
  Tensor matrix;  // the gradient as [rows, cols], a view of the bucket
  Tensor p, q;    // views of the bucket's P and Q memory: [rows, r], [cols, r]
};

// The rest of one bucket's PowerSGD after the hook launched the uncompressed all-reduce and P's:
// wait() unpacks the uncompressed gradients, orthonormalises P, computes and all-reduces Q, and
// writes P Q^T into the gradients (then the error, with error feedback).
class PowerSGDWork final : public Work {
 public:
  PowerSGDWork(ProcessGroup& group, std::shared_ptr<Work> flat_work, Tensor flat, std::vector<Tensor> flat_grads,
               std::shared_ptr<Work> p_work, Tensor q_memory, std::vector<Compressed> compressed, Tensor input_copy,
               Tensor buffer, Tensor* error)
      : group_(group), flat_work_(std::move(flat_work)), flat_(std::move(flat)), flat_grads_(std::move(flat_grads)),
        p_work_(std::move(p_work)), q_memory_(std::move(q_memory)), compressed_(std::move(compressed)),
        input_copy_(std::move(input_copy)), buffer_(std::move(buffer)), error_(error) {}

  bool is_completed() override { return done_; }
  void wait(Millis timeout) override {
    if (done_) return;
    flat_work_->wait(timeout);
    int64_t off = 0;
    for (Tensor& g : flat_grads_) {
      g.copy_(flat_.slice(0, off, off + g.numel()).view(g.shape()));
      off += g.numel();
    }
    p_work_->wait(timeout);
    for (Compressed& c : compressed_) {
      orthogonalize(c.p);
      c.q.copy_(kernels::matmul(c.matrix.transpose(0, 1).contiguous(), c.p));
    }
    group_.allreduce(q_memory_)->wait(timeout);
    for (Compressed& c : compressed_) c.matrix.copy_(kernels::matmul(c.p, c.q.transpose(0, 1).contiguous()));
    if (error_) {
      // What this rank sent minus its share of what came back: the buffer went in divided by the
      // world size and holds the average now (PyTorch's undivided input minus the average, over W).
      input_copy_.add_(buffer_, -1.0 / group_.size());
      *error_ = input_copy_;
    }
    done_ = true;
  }
  void synchronize(Millis timeout) override {
    wait(timeout);
    tandem::synchronize(buffer_.device());
  }
  std::string description() const override { return "PowerSGD(" + p_work_->description() + ")"; }

 private:
  ProcessGroup& group_;
  std::shared_ptr<Work> flat_work_;
  Tensor flat_;
  std::vector<Tensor> flat_grads_;
  std::shared_ptr<Work> p_work_;
  Tensor q_memory_;
  std::vector<Compressed> compressed_;
  Tensor input_copy_, buffer_;
  Tensor* error_;
  bool done_ = false;
};

}  // namespace

void orthogonalize_with_tensor_ops(Tensor& m) {
  using kernels::BinaryOp;
  TANDEM_CHECK(m.dim() == 2 && m.dtype() == kFloat32,
               "PowerSGD: orthogonalize expects a float32 [rows, cols] matrix, got ", m.str());
  const int64_t cols = m.size(1);
  const Tensor zero = Tensor::zeros({}, kFloat32, m.device()), one = Tensor::ones({}, kFloat32, m.device());
  for (int64_t c = 0; c < cols; ++c) {
    Tensor col = m.slice(1, c, c + 1);  // [rows, 1], a view of m
    const Tensor norm = kernels::unary(kernels::UnaryOp::Sqrt,
                                       kernels::sum_dims(kernels::binary(BinaryOp::Mul, col, col), {0}, true));
    // A zero column stays zero (divided by 1).
    const Tensor denom = kernels::where(kernels::compare(kernels::CompareOp::Gt, norm, zero), norm, one);
    const Tensor unit = kernels::binary(BinaryOp::Div, col, denom);
    col.copy_(unit);
    if (c + 1 == cols) break;
    Tensor rest = m.slice(1, c + 1, cols);  // [rows, cols - c - 1]: each loses its part along `unit`
    const Tensor dots = kernels::sum_dims(kernels::binary(BinaryOp::Mul, unit, rest), {0}, true);
    rest.copy_(kernels::binary(BinaryOp::Sub, rest, kernels::binary(BinaryOp::Mul, unit, dots)));
  }
}

std::shared_ptr<Work> powersgd(PowerSGDState& state, ProcessGroup& group, GradBucket& bucket) {
  const PowerSGDOptions& o = state.options;
  TANDEM_CHECK(o.rank >= 1, "PowerSGD: the rank (matrix_approximation_rank) must be >= 1, got ", o.rank);
  const bool active = state.iteration >= o.start_iter;
  if (bucket.is_last) ++state.iteration;
  Tensor& buffer = bucket.buffer;
  if (!active) return group.allreduce(buffer);
  const Device device = buffer.device();
  const size_t index = bucket.index;

  // A bucket whose layout changed (the buckets were rebuilt) starts afresh.
  std::vector<int64_t> layout;
  for (const Tensor& g : bucket.gradients) {
    layout.push_back(g.dim());
    layout.insert(layout.end(), g.shape().begin(), g.shape().end());
  }
  if (state.layout[index] != layout) {
    state.error.erase(index);
    state.p_memory.erase(index);
    state.q_memory.erase(index);
    state.layout[index] = layout;
  }
  auto fresh = [&](std::map<size_t, Tensor>& memory) { return memory.find(index) == memory.end(); };
  Tensor* error = nullptr;
  Tensor input_copy;
  if (o.error_feedback) {
    if (!fresh(state.error)) buffer.add_(state.error[index]);
    error = &state.error[index];
    input_copy = buffer.clone();
  }

  // Step 1: which gradients to compress, and the sizes of P and Q.
  std::vector<Tensor> uncompressed;
  std::vector<Compressed> compressed;
  int64_t p_total = 0, q_total = 0, flat_total = 0;
  for (const Tensor& g : bucket.gradients) {
    const int64_t rows = g.dim() > 0 ? g.size(0) : 1, cols = rows > 0 ? g.numel() / rows : 0;
    const int64_t r = std::min<int64_t>({rows, cols, o.rank});
    state.numel_before += g.numel();
    if (g.dim() > 1 && (rows + cols) * r * o.min_compression_rate < static_cast<double>(rows * cols)) {
      compressed.push_back({g.view({rows, cols}), Tensor(), Tensor()});
      p_total += rows * r;
      q_total += cols * r;
      state.numel_after += (rows + cols) * r;
    } else {
      uncompressed.push_back(g);
      flat_total += g.numel();
      state.numel_after += g.numel();
    }
  }
  // Step 2: the uncompressed gradients in one message.
  Tensor flat = Tensor::empty({flat_total}, kFloat32, device);
  int64_t off = 0;
  for (const Tensor& g : uncompressed) {
    flat.slice(0, off, off + g.numel()).view(g.shape()).copy_(g);
    off += g.numel();
  }
  auto flat_work = group.allreduce(flat);

  // Step 3: P = M Q, with Q warm-started from the last iteration or drawn afresh.
  const bool randomize = !o.warm_start || fresh(state.p_memory) || fresh(state.q_memory);
  if (randomize) {
    state.p_memory[index] = Tensor::empty({p_total}, kFloat32, device);
    state.q_memory[index] = Tensor::empty({q_total}, kFloat32, device);
  }
  Tensor p_memory = state.p_memory[index], q_memory = state.q_memory[index];
  int64_t p_off = 0, q_off = 0;
  Generator fill(randomize ? state.rng.below(1000000000) : 0);
  for (Compressed& c : compressed) {
    const int64_t rows = c.matrix.size(0), cols = c.matrix.size(1);
    const int64_t r = std::min<int64_t>({rows, cols, o.rank});
    c.p = p_memory.slice(0, p_off, p_off + rows * r).view({rows, r});
    c.q = q_memory.slice(0, q_off, q_off + cols * r).view({cols, r});
    p_off += rows * r;
    q_off += cols * r;
    if (randomize) {
      Tensor host = Tensor::empty({cols, r});
      for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = static_cast<float>(fill.normal());
      c.q.copy_(host);
    }
    orthogonalize(c.q);
    c.p.copy_(kernels::matmul(c.matrix, c.q));
  }
  auto p_work = group.allreduce(p_memory);
  bucket.bytes_sent = (flat_total + p_total + q_total) * static_cast<int64_t>(sizeof(float));
  return std::make_shared<PowerSGDWork>(group, std::move(flat_work), flat, std::move(uncompressed), std::move(p_work),
                                        q_memory, std::move(compressed), input_copy, buffer, error);
}

CommHook powersgd_hook(const PowerSGDOptions& options) {
  TANDEM_CHECK(options.rank >= 1, "PowerSGD: the rank (matrix_approximation_rank) must be >= 1, got ", options.rank);
  TANDEM_CHECK(options.start_iter >= 0, "PowerSGD: start_iter must be >= 0, got ", options.start_iter);
  TANDEM_CHECK(options.min_compression_rate > 0, "PowerSGD: min_compression_rate must be positive, got ",
               options.min_compression_rate);
  return make_comm_hook<PowerSGDState>(std::make_shared<PowerSGDState>(options), powersgd);
}

}  // namespace tandem::dist
