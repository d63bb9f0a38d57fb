#include "dist/parallel/reducer.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/autograd.h"
#include "dist/group/host_values.h"
#include "kernels/pointwise.h"

namespace tandem::dist {
namespace {

using Clock = std::chrono::steady_clock;

void scale_in_place(Tensor& t, double factor) { copy_scaled(t, t, factor); }

}  // namespace

void copy_scaled(Tensor& dst, const Tensor& src, double factor) {
  if (dst.device().is_cpu() && src.is_contiguous() && src.dtype() == kFloat32 && dst.dtype() == kFloat32) {
    Eigen::Map<Eigen::ArrayXf> d(dst.data<float>(), dst.numel());
    d = Eigen::Map<const Eigen::ArrayXf>(src.data<float>(), src.numel()) * static_cast<float>(factor);
    return;
  }
  dst.copy_(kernels::binary(kernels::BinaryOp::Mul, src, factor));
}

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

  local_used_.assign(params_.size(), 0.0f);
  for (size_t i = 0; i < params_.size(); ++i)
    hook_handles_.push_back(
        params_[i].second.register_post_accumulate_grad_hook([this, i](const Tensor&) { on_hook(i); }));
}

// The hooks go with the reducer: a parameter that outlives it (the user's model) no longer calls it.
Reducer::~Reducer() {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].second.remove_post_accumulate_grad_hook(hook_handles_[i]);
}

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
    GradBucket& g = current.grad;
    g.index = buckets_.size();
    g.buffer = flat.slice(0, flat_offset, flat_offset + elements);
    for (size_t k = 0; k < current.params.size(); ++k) {
      const Tensor& p = params_[current.params[k]].second;
      g.parameters.push_back(p);
      g.gradients.push_back(g.buffer.slice(0, g.offsets[k], g.offsets[k] + p.numel()).view(p.shape()));
    }
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
    current.grad.offsets.push_back(elements);
    elements += p.numel();
    bytes += static_cast<int64_t>(p.nbytes());
    if (bytes >= cap_bytes(buckets_.size())) close();
  }
  if (!current.params.empty()) close();
  buckets_.back().grad.is_last = true;

  if (options_.gradient_as_bucket_view) {
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& p = params_[i].second;
      if (!p.grad().defined()) continue;  // stays undefined until a reduction gives it a value
      Tensor view = bucket_view(i);
      view.copy_(p.grad());
      p.set_grad(view);
    }
  }
  next_launch_ = 0;
}

const Tensor& Reducer::bucket_view(size_t index) const {
  return buckets_[bucket_of_[index]].grad.gradients[slot_in_bucket_[index]];
}

std::vector<std::vector<size_t>> Reducer::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (auto& b : buckets_) out.push_back(b.params);
  return out;
}

std::vector<size_t> Reducer::unused_parameters() const {
  std::vector<size_t> out;
  const std::vector<bool>& set = options_.static_graph ? static_unused_ : unused_;
  for (size_t i = 0; i < set.size(); ++i)
    if (set[i]) out.push_back(i);
  return out;
}

void Reducer::reset_iteration() {
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  unused_.assign(params_.size(), false);
  if (static_after_first()) hooks_left_ = hooks_seen_;
  if (static_first()) hooks_seen_.assign(params_.size(), 0);
  next_launch_ = 0;
  hook_fired_ = false;
  local_used_work_.reset();
  local_used_reduced_ = false;
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

void Reducer::prepare_for_forward() {
  if (should_rebuild() && !arrival_order_.empty()) rebuild_buckets();
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs) {
  if (!require_sync_) {
    expecting_backward_ = false;
    return;
  }
  // A second DDP forward before backward: its outputs join the first's.
  const bool merge = expecting_backward_ && !hook_fired_;
  if (!merge) reset_iteration();
  expecting_backward_ = true;
  if (dynamic_find_unused()) {
    const std::vector<bool> reachable = reachable_params(outputs);
    ++stats_.graph_walks;
    for (size_t i = 0; i < params_.size(); ++i) unused_[i] = (merge ? unused_[i] : true) && !reachable[i];
  } else if (static_after_first()) {
    unused_ = static_unused_;
  }
}

void Reducer::on_hook(size_t index) {
  Tensor& p = params_[index].second;
  // Used on this rank: counted under no_sync too, so a gradient accumulated there is reduced.
  if ((dynamic_find_unused() || static_first()) && p.grad().defined()) local_used_[index] = 1.0f;
  if (!expecting_backward_ || !require_sync_) return;  // nothing prepared (or no_sync): ignored
  if (!callback_queued_) {
    std::weak_ptr<bool> alive = alive_;
    autograd::queue_callback([this, alive] {
      if (alive.lock()) end_of_backward();
    });
    callback_queued_ = true;
  }
  if (static_first()) {  // everything is reduced at the end of this backward
    ++hooks_seen_[index];
    return;
  }
  if (!hook_fired_) {
    hook_fired_ = true;
    for (size_t i = 0; i < params_.size(); ++i)
      if (unused_[i]) mark_ready(i);
  }
  if (static_after_first()) {
    TANDEM_CHECK(hooks_left_[index] > 0, "DistributedDataParallel: parameter '", params_[index].first,
                 "' received a gradient it did not receive in the first iteration; static_graph needs the same "
                 "graph (the same parameters used, as many times) in every iteration: drop static_graph");
    if (--hooks_left_[index] > 0) return;  // more backward passes of this iteration will reach it
  }
  if (should_rebuild()) arrival_order_.push_back(index);
  mark_ready(index);
}

void Reducer::mark_ready(size_t index) {
  if (ready_[index]) {
    const bool was_unused = unused_[index];
    TANDEM_FAIL("DistributedDataParallel: parameter '", params_[index].first, "' received its gradient twice in one "
                "reduction. ",
                was_unused ? "DDP's forward outputs do not reach it, so find_unused_parameters marked it unused, "
                             "yet backward reached it: it is used outside the wrapped module's forward (e.g. in the "
                             "loss). Use it inside forward, or return what uses it from forward"
                           : "Two backward passes reached it after one DDP forward: run a DDP forward before each "
                             "backward, or sum the losses and call backward once");
  }
  Tensor grad = params_[index].second.grad();
  Tensor view = bucket_view(index);
  if (!grad.defined()) {
    view.zero_();  // contributes zero; .grad stays undefined unless some rank used it
  } else if (options_.gradient_as_bucket_view) {
    if (grad.storage() != view.storage() || grad.offset() != view.offset()) {
      view.copy_(grad);
      params_[index].second.set_grad(view);
    }
  } else {
    copy_scaled(view, grad, 1.0 / group_->size());
  }
  ready_[index] = true;
  --buckets_[bucket_of_[index]].pending;
  launch_ready_buckets();
  if (next_launch_ == buckets_.size() && dynamic_find_unused() && !local_used_work_) {
    local_used_comm_ = values_on(*group_, std::vector<double>(local_used_.begin(), local_used_.end()));
    local_used_work_ = group_->allreduce(local_used_comm_);
  }
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    // With gradient_as_bucket_view the gradients went in undivided (most are the views themselves).
    if (options_.gradient_as_bucket_view) scale_in_place(b.grad.buffer, 1.0 / group_->size());
    b.grad.bytes_sent = static_cast<int64_t>(b.grad.buffer.nbytes());
    b.work = options_.comm_hook(*group_, b.grad);
    if (on_launch_) on_launch_(next_launch_);
    ++next_launch_;
  }
}

void Reducer::end_of_backward() {
  callback_queued_ = false;
  if (static_first() && expecting_backward_) return reduce_all_at_end();
  if (next_launch_ == buckets_.size()) return finalize();
  // static_graph: a later backward pass of this iteration will reach the rest.
  if (static_after_first()) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i] && hooks_left_[i] < hooks_seen_[i]) return;
  }
  fail_unready();
}

// static_graph's first iteration (PyTorch's delay_all_reduce): learn the unused set and the hook
// counts, then reduce every bucket now.
void Reducer::reduce_all_at_end() {
  static_unused_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) static_unused_[i] = hooks_seen_[i] == 0;
  local_used_comm_ = values_on(*group_, std::vector<double>(local_used_.begin(), local_used_.end()));
  local_used_work_ = group_->allreduce(local_used_comm_);
  for (size_t i = 0; i < params_.size(); ++i) mark_ready(i);
  static_learned_ = true;
  finalize();
}

void Reducer::fail_unready() const {
  std::string names;
  int listed = 0, missing = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    ++missing;
    if (listed++ < 8) names += (names.empty() ? "" : ", ") + params_[i].first;
  }
  if (missing > 8) names += ", ...";
  TANDEM_FAIL("DistributedDataParallel: backward ended but ", missing, " parameter(s) received no gradient: ", names,
              ". Their reduction never started, so the ranks would go out of step. If the model does not use "
              "every parameter in every iteration, enable find_unused_parameters (--find-unused-parameters); "
              "otherwise make sure every output DDP's forward returned takes part in the loss");
}

// Whether no rank used parameter `index` (find_unused_parameters, static_graph). Waits for the
// all-reduced use map only when this rank did not use it, as PyTorch does.
bool Reducer::globally_unused(size_t index) {
  if (!options_.find_unused_parameters && !options_.static_graph) return false;
  if (local_used_[index] != 0.0f) return false;
  if (!local_used_reduced_ && local_used_work_) {
    local_used_work_->wait(group_->timeout());
    const std::vector<float> all = local_used_comm_.to(Device::cpu()).to(kFloat32).to_vector<float>();
    local_used_ = all;
    local_used_reduced_ = true;
  }
  return local_used_[index] == 0.0f;
}

void Reducer::finalize() {
  expecting_backward_ = false;
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
  int64_t sent = 0, bucket_bytes = 0;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    const auto wait_start = Clock::now();
    b.work->wait(group_->timeout());
    waited_ms += std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count();
    if (comm_timer_ && k + 1 == buckets_.size()) comm_timer_->stop();
    sent += b.grad.bytes_sent;
    bucket_bytes += static_cast<int64_t>(b.grad.buffer.nbytes());
    for (size_t i : b.params) write_back(i, globally_unused(i));
  }
  if (!comm_timer_) {
    stats_.exposed_comm_ms = waited_ms;
    stats_.exposed_comm_iteration = iteration_;
  }
  stats_.finalize_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  stats_.bytes = sent;
  stats_.bucket_bytes = bucket_bytes;
  stats_.iteration = iteration_;
  for (auto& b : buckets_) b.work.reset();
  if (dynamic_find_unused()) std::fill(local_used_.begin(), local_used_.end(), 0.0f);
  ++iteration_;
}

// The reduced gradient of parameter `index` from its bucket into .grad (or .grad made the view).
// A parameter no rank used keeps its .grad as it was.
void Reducer::write_back(size_t index, bool global_unused) {
  if (global_unused) return;
  Tensor& p = params_[index].second;
  const Tensor& view = bucket_view(index);
  const Tensor grad = p.grad();
  if (options_.gradient_as_bucket_view) {
    if (!grad.defined() || grad.storage() != view.storage() || grad.offset() != view.offset()) p.set_grad(view);
  } else if (grad.defined()) {
    Tensor g = grad;
    g.copy_(view);
  } else {
    p.set_grad(view.clone());
  }
}

void Reducer::rebuild_buckets() {
  rebuilt_ = true;
  ++stats_.rebuilds;
  // static_graph: parameters unused on this rank arrive last.
  if (options_.static_graph)
    for (size_t i = 0; i < params_.size(); ++i)
      if (static_unused_[i]) arrival_order_.push_back(i);
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

namespace tandem::dist {

void Reducer::shadow_backward() {
  const bool static_first_now = static_first();
  reset_iteration();
  // This rank contributes nothing: zeros in its buckets and in its use map.
  auto send_use_map = [&] {
    std::fill(local_used_.begin(), local_used_.end(), 0.0f);
    local_used_comm_ = values_on(*group_, std::vector<double>(params_.size(), 0.0));
    local_used_work_ = group_->allreduce(local_used_comm_);
  };
  if (static_first_now) send_use_map();  // reduce_all_at_end sends it before the buckets
  for (Bucket& b : buckets_) {
    b.grad.buffer.zero_();
    b.grad.bytes_sent = static_cast<int64_t>(b.grad.buffer.nbytes());
    b.work = options_.comm_hook(*group_, b.grad);
  }
  if (dynamic_find_unused()) send_use_map();
  // The others' average, written into .grad as they write it: this rank's optimizer can take the
  // same step, so its parameters and optimizer state stay equal to theirs.
  for (Bucket& b : buckets_) {
    b.work->wait(group_->timeout());
    b.work.reset();
    for (size_t i : b.params) write_back(i, globally_unused(i));
  }
  if (dynamic_find_unused()) std::fill(local_used_.begin(), local_used_.end(), 0.0f);
  // The rebuild at the next forward needs an order on every rank; rank 0's is the one used.
  if (should_rebuild() && arrival_order_.empty() && !static_first_now)
    for (size_t i = 0; i < params_.size(); ++i) arrival_order_.push_back(i);
  if (static_first_now) {
    static_unused_.assign(params_.size(), true);
    hooks_seen_.assign(params_.size(), 0);
    static_learned_ = true;
  }
}

}  // namespace tandem::dist
