#include "dist/reducer.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/autograd.h"
#include "dist/host_values.h"
#include "kernels/elementwise.h"

namespace tandem::dist {
namespace {

using Clock = std::chrono::steady_clock;

// dst = src * factor, one pass on CPU.
void copy_scaled(Tensor& dst, const Tensor& src, double factor) {
  if (dst.device().is_cpu() && src.is_contiguous()) {
    Eigen::Map<Eigen::ArrayXf> d(dst.data<float>(), dst.numel());
    d = Eigen::Map<const Eigen::ArrayXf>(src.data<float>(), src.numel()) * static_cast<float>(factor);
    return;
  }
  dst.copy_(kernels::scale(src, factor));
}

void scale_in_place(Tensor& t, double factor) { copy_scaled(t, t, factor); }

}  // namespace

Reducer::Reducer(nn::NamedTensors params, std::shared_ptr<ProcessGroup> group, ReducerOptions options)
    : group_(std::move(group)), options_(std::move(options)), alive_(std::make_shared<bool>(true)) {
  for (auto& [name, p] : params)
    if (p.requires_grad()) params_.emplace_back(name, p);
  TANDEM_CHECK(!params_.empty(), "DistributedDataParallel: the model has no parameter that requires grad");
  TANDEM_CHECK(options_.first_bucket_cap_mb > 0,
               "DistributedDataParallel: first_bucket_cap_mb must be positive, got ",
               options_.first_bucket_cap_mb,
               " (bucket_cap_mb <= 0 asks for the automatic cap; the first bucket's cap is always explicit)");
  TANDEM_CHECK(options_.comm_hook != nullptr, "DistributedDataParallel: comm hook is empty");
  const Device device = params_[0].second.device();
  for (auto& [name, p] : params_) {
    TANDEM_CHECK(p.dtype() == kFloat32, "DistributedDataParallel: parameter '", name, "' is ", p.str(),
                 ", expected float32");
    TANDEM_CHECK(p.device() == device, "DistributedDataParallel: parameter '", name, "' is on ", p.device().str(),
                 " but '", params_[0].first, "' is on ", device.str(), "; put the model on one device");
    TANDEM_CHECK(p.is_contiguous(), "DistributedDataParallel: parameter '", name, "' is not contiguous");
  }
  if (options_.bucket_cap_mb <= 0) measure_auto_bucket_cap();
  if (group_->comm_device().is_cuda()) comm_timer_ = std::make_unique<DeviceTimer>(group_->comm_device());
  ready_.assign(params_.size(), false);
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  build_buckets(order);

  std::weak_ptr<bool> alive = alive_;
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].second.register_post_accumulate_grad_hook([this, alive, i](const Tensor&) {
      if (alive.lock()) mark_ready(i);
    });
  }
}

Reducer::~Reducer() { alive_.reset(); }

double Reducer::auto_bucket_cap_mb(double latency_us, double bandwidth_gbps, int64_t total_bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const double quarter_mib = static_cast<double>(total_bytes) / 4 / kMiB;
  const double lower = 1.0, upper = std::max(lower, std::min(100.0, quarter_mib));
  const double bytes = kAutoLatencyFactor * latency_us * 1e-6 * bandwidth_gbps * 1e9;
  if (!(bytes > 0)) return upper;  // no usable measurement (NaN or zero): few, large buckets
  return std::clamp(bytes / kMiB, lower, upper);
}

// Times all-reduces of a 4 KiB message and of a probe of up to 16 MiB (one untimed run each, then
// the median of 5) on every rank, and broadcasts rank 0's result so every rank uses the same cap.
void Reducer::measure_auto_bucket_cap() {
  int64_t total = 0;
  for (auto& [name, p] : params_) total += static_cast<int64_t>(p.nbytes());
  if (group_->size() == 1) {  // nothing to measure: no communication at all
    options_.bucket_cap_mb = auto_bucket_cap_mb(0.0, 0.0, total);
    auto_cap_ = AutoBucketCap{false, 0.0, 0.0, 0.0, options_.bucket_cap_mb};
    return;
  }
  const Device device = params_[0].second.device();
  const int64_t probe_elems = std::clamp<int64_t>(total / 4 / 4, int64_t{1} << 18, int64_t{1} << 22);
  // In the group's comm_buffer, where the buckets will be: the path and cost the buckets will see.
  Tensor small = group_->comm_buffer(1024, kFloat32, device);
  Tensor probe = group_->comm_buffer(probe_elems, kFloat32, device);
  // synchronize(), not wait(): on NCCL wait() only orders the compute stream after the collective.
  auto median_ms = [&](Tensor& t) {
    group_->allreduce(t)->synchronize(group_->timeout());
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = Clock::now();
      group_->allreduce(t)->synchronize(group_->timeout());
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  group_->barrier()->synchronize(group_->timeout());
  const double latency_ms = median_ms(small);
  const double probe_ms = median_ms(probe);
  const double probe_bytes = static_cast<double>(probe_elems) * 4;
  // Bytes over the whole probe time (latency included): a lower bound of the bandwidth that stays
  // sane when the two timings are close (a loaded machine), where subtracting them would not.
  const double bandwidth_gbps = probe_bytes / (std::max(probe_ms, 1e-3) * 1e-3) / 1e9;
  const std::vector<double> v = broadcast_values(
      *group_, {auto_bucket_cap_mb(latency_ms * 1e3, bandwidth_gbps, total), latency_ms * 1e3, bandwidth_gbps}, 0,
      "DistributedDataParallel: the automatic bucket cap");
  options_.bucket_cap_mb = v[0];
  auto_cap_ = AutoBucketCap{true, v[1], v[2], probe_bytes / (1024.0 * 1024.0), v[0]};
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  slot_in_bucket_.assign(params_.size(), 0);
  const Device device = params_[0].second.device();
  auto cap_bytes = [&](size_t bucket) {
    const double mb = bucket == 0 ? options_.first_bucket_cap_mb : options_.bucket_cap_mb;
    return static_cast<int64_t>(mb * 1024 * 1024);
  };
  // Every bucket is a slice of one buffer from the group (collective: every rank builds the same
  // layout), which on one host lives in shared memory where the all-reduce reads it in place.
  int64_t total = 0;
  for (size_t idx : order) total += params_[idx].second.numel();
  const Tensor flat = group_->comm_buffer(total, kFloat32, device);
  int64_t flat_offset = 0;
  Bucket current;
  int64_t bytes = 0, elements = 0;
  auto close = [&] {
    current.buffer = flat.slice(0, flat_offset, flat_offset + elements);
    flat_offset += elements;
    current.pending = current.params.size();
    buckets_.push_back(std::move(current));
    current = Bucket();
    bytes = elements = 0;
  };
  for (size_t idx : order) {
    const Tensor& p = params_[idx].second;
    bucket_of_[idx] = buckets_.size();
    slot_in_bucket_[idx] = current.params.size();
    current.params.push_back(idx);
    current.offsets.push_back(elements);
    elements += p.numel();
    bytes += static_cast<int64_t>(p.nbytes());
    if (bytes >= cap_bytes(buckets_.size())) close();
  }
  if (!current.params.empty()) close();

  if (options_.gradient_as_bucket_view) {
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& p = params_[i].second;
      Tensor view = bucket_view(i);
      if (p.grad().defined()) view.copy_(p.grad());
      p.set_grad(view);
    }
  }
  next_launch_ = 0;
}

Tensor Reducer::bucket_view(size_t index) {
  const Bucket& b = buckets_[bucket_of_[index]];
  const int64_t off = b.offsets[slot_in_bucket_[index]];
  const Tensor& p = params_[index].second;
  return b.buffer.slice(0, off, off + p.numel()).view(p.shape());
}

std::vector<std::vector<size_t>> Reducer::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (auto& b : buckets_) out.push_back(b.params);
  return out;
}

void Reducer::reset_iteration() {
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  finalize_queued_ = false;
}

std::vector<bool> Reducer::reachable_params(const std::vector<Tensor>& outputs) const {
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  for (const Tensor& out : outputs)
    if (out.defined() && out.grad_fn() && seen.insert(out.grad_fn().get()).second) stack.push_back(out.grad_fn().get());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges)
      if (e.valid() && seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  }
  std::vector<bool> reachable(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].second;
    const auto& acc = p.autograd_meta().grad_accumulator;
    reachable[i] = acc && seen.count(acc.get());
  }
  return reachable;
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs) {
  if (!require_sync_) {
    expecting_backward_ = false;
    return;
  }
  reset_iteration();
  expecting_backward_ = true;
  if (!options_.find_unused_parameters) return;

  std::vector<bool> unused(params_.size(), false);
  if (options_.static_graph && iteration_ > 0) {
    unused = unused_static_;
  } else {
    std::vector<bool> reachable = reachable_params(outputs);
    for (size_t i = 0; i < params_.size(); ++i) unused[i] = !reachable[i];
    if (options_.static_graph) unused_static_ = unused;
  }
  // Unused parameters contribute zero and are ready now.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!unused[i]) continue;
    Tensor view = bucket_view(i);
    view.zero_();
    ready_[i] = true;
    if (iteration_ == 0) arrival_order_.push_back(i);
    --buckets_[bucket_of_[i]].pending;
  }
  launch_ready_buckets();
}

void Reducer::mark_ready(size_t index) {
  if (!require_sync_) return;  // no_sync: gradients accumulate in .grad
  if (!expecting_backward_) {
    // backward on a graph DDP's forward did not prepare (e.g. a second
    // backward over the same forward): start a fresh reduction.
    reset_iteration();
    expecting_backward_ = true;
  }
  TANDEM_CHECK(!ready_[index], "DistributedDataParallel: parameter '", params_[index].first,
               "' received its gradient twice in one reduction");
  if (!finalize_queued_) {
    std::weak_ptr<bool> alive = alive_;
    autograd::queue_callback([this, alive] {
      if (alive.lock()) finalize();
    });
    finalize_queued_ = true;
  }
  Tensor& p = params_[index].second;
  Tensor grad = p.grad();
  Tensor view = bucket_view(index);
  if (options_.gradient_as_bucket_view) {
    if (!grad.defined() || grad.storage() != view.storage()) {
      if (grad.defined())
        view.copy_(grad);
      else
        view.zero_();
      p.set_grad(view);
    }
  } else {
    copy_scaled(view, grad, 1.0 / group_->size());
  }
  ready_[index] = true;
  if (iteration_ == 0) arrival_order_.push_back(index);
  --buckets_[bucket_of_[index]].pending;
  launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    if (options_.gradient_as_bucket_view) scale_in_place(b.buffer, 1.0 / group_->size());
    b.work = options_.comm_hook(*group_, b.buffer);
    if (on_launch_) on_launch_(next_launch_);
    ++next_launch_;
  }
}

void Reducer::finalize() {
  expecting_backward_ = false;
  finalize_queued_ = false;
  if (next_launch_ < buckets_.size()) {
    std::string names;
    int listed = 0, missing = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      ++missing;
      if (listed++ < 8) names += (names.empty() ? "" : ", ") + params_[i].first;
    }
    if (missing > 8) names += ", ...";
    TANDEM_FAIL("DistributedDataParallel: backward ended but ", missing, " parameter(s) received no gradient: ",
                names,
                ". Their reduction never started, so the ranks would go out of step. If the model does not use "
                "every parameter in every iteration, enable find_unused_parameters (--find-unused-parameters); "
                "otherwise make sure every output DDP's forward returned takes part in the loss");
  }
  // Bucket by bucket, in launch order: wait for it, then write its gradients back, so the copies of
  // the early buckets run while the later ones are still being reduced. On the host (Gloo)
  // exposed_comm_ms adds up the waits only; finalize_ms includes the copies. On a device group the
  // waits are stream dependencies the host passes at once: the exposure is the compute stream's
  // time from here until the last bucket arrived (the earlier buckets' copies included), read one
  // synchronised backward later, when the device has run it.
  if (comm_timer_) {
    const double previous = comm_timer_->elapsed_ms();
    if (!std::isnan(previous)) stats_.exposed_comm_ms = previous;
    stats_.exposed_comm_iteration = std::isnan(previous) ? stats_.exposed_comm_iteration : iteration_ - 1;
    comm_timer_->start();
  }
  const auto start = Clock::now();
  double waited_ms = 0.0;
  int64_t bytes = 0;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    const auto wait_start = Clock::now();
    b.work->wait(group_->timeout());
    waited_ms += std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count();
    if (comm_timer_ && k + 1 == buckets_.size()) comm_timer_->stop();
    bytes += static_cast<int64_t>(b.buffer.nbytes());
    for (size_t i : b.params) write_back(i);
  }
  if (!comm_timer_) {
    stats_.exposed_comm_ms = waited_ms;
    stats_.exposed_comm_iteration = iteration_;
  }
  stats_.finalize_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  stats_.bytes = bytes;
  stats_.iteration = iteration_;
  for (auto& b : buckets_) b.work.reset();

  if (iteration_ == 0 && !rebuilt_) rebuild_buckets_from_arrival_order();
  ++iteration_;
}

// The reduced gradient of parameter `index` from its bucket into .grad (or .grad made the view).
void Reducer::write_back(size_t index) {
  Tensor& p = params_[index].second;
  Tensor view = bucket_view(index);
  if (options_.gradient_as_bucket_view) {
    if (!p.grad().defined() || p.grad().storage() != view.storage()) p.set_grad(view);
  } else if (p.grad().defined()) {
    Tensor g = p.grad();
    g.copy_(view);
  } else {
    p.set_grad(view.clone());
  }
}

void Reducer::rebuild_buckets_from_arrival_order() {
  rebuilt_ = true;
  // Rank 0's order decides, so every rank builds the same buckets.
  const size_t n = params_.size();
  std::vector<double> mine(n, -1.0);
  for (size_t i = 0; i < n && i < arrival_order_.size(); ++i) mine[i] = static_cast<double>(arrival_order_[i]);
  const std::vector<double> order =
      broadcast_values(*group_, mine, 0, "DistributedDataParallel: the bucket order of rank 0");
  std::vector<size_t> chosen;
  std::vector<bool> taken(params_.size(), false);
  for (size_t i = 0; i < n; ++i) {
    const double v = order[i];
    if (v < 0) continue;
    const size_t idx = static_cast<size_t>(v);
    TANDEM_CHECK(idx < params_.size() && !taken[idx], "DistributedDataParallel: rank 0 sent a bad bucket order");
    taken[idx] = true;
    chosen.push_back(idx);
  }
  for (size_t i = params_.size(); i-- > 0;)
    if (!taken[i]) chosen.push_back(i);
  build_buckets(chosen);
  arrival_order_.clear();
}

}  // namespace tandem::dist
