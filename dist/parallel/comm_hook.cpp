#include "dist/parallel/comm_hook.h"

#include "dist/parallel/powersgd.h"

namespace tandem::dist {
namespace {

// Waits for the collective on the compressed copy, then writes it back.
class DecompressWork final : public Work {
 public:
  DecompressWork(std::shared_ptr<Work> inner, Tensor compressed, Tensor target)
      : inner_(std::move(inner)), compressed_(std::move(compressed)), target_(std::move(target)) {}
  bool is_completed() override { return done_ || inner_->is_completed(); }
  void wait(Millis timeout) override {
    if (done_) return;
    inner_->wait(timeout);
    target_.copy_(compressed_);  // on a device: queued after the collective on the compute stream
    done_ = true;
  }
  void synchronize(Millis timeout) override {
    const bool was_done = done_;
    inner_->synchronize(timeout);
    wait(timeout);
    if (!was_done) tandem::synchronize(target_.device());  // the copy back, too
  }
  std::string description() const override { return inner_->description() + " (compressed)"; }

 private:
  std::shared_ptr<Work> inner_;
  Tensor compressed_, target_;
  bool done_ = false;
};

std::shared_ptr<Work> compress_hook(ProcessGroup& group, GradBucket& bucket, DType wire) {
  Tensor compressed = bucket.buffer.to(wire);
  bucket.bytes_sent = static_cast<int64_t>(compressed.nbytes());
  auto work = group.allreduce(compressed);
  return std::make_shared<DecompressWork>(std::move(work), compressed, bucket.buffer);
}

}  // namespace

std::shared_ptr<Work> allreduce_hook(ProcessGroup& group, GradBucket& bucket) {
  return group.allreduce(bucket.buffer);
}

std::shared_ptr<Work> fp16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return compress_hook(group, bucket, kFloat16);
}

std::shared_ptr<Work> bf16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return compress_hook(group, bucket, kBFloat16);
}

CommHook comm_hook_by_name(const std::string& name, const CommHookOptions& o) {
  if (name == "allreduce") return allreduce_hook;
  if (name == "fp16") return fp16_compress_hook;
  if (name == "bf16") return bf16_compress_hook;
  if (name == "powersgd") {
    PowerSGDOptions p;
    p.rank = o.powersgd_rank;
    p.start_iter = o.powersgd_start_iter;
    p.min_compression_rate = o.powersgd_min_compression_rate;
    p.error_feedback = o.powersgd_error_feedback;
    p.warm_start = o.powersgd_warm_start;
    p.seed = o.powersgd_seed;
    return powersgd_hook(p);
  }
  TANDEM_FAIL("unknown comm hook '", name, "', expected ", comm_hook_names());
}

}  // namespace tandem::dist
