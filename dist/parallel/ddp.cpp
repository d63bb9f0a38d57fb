#include "dist/parallel/ddp.h"

#include <functional>
#include <map>

#include "core/autograd.h"
#include "dist/group/host_values.h"

namespace tandem::dist {
namespace {

// A 52-bit fingerprint (exact in a double) of a parameter's name, shape and dtype.
double fingerprint(const std::string& name, const Tensor& t) {
  std::string text = name + "|" + shape_str(t.shape()) + "|" + dtype_name(t.dtype());
  return static_cast<double>(std::hash<std::string>{}(text) & ((uint64_t{1} << 52) - 1));
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group, DDPOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  TANDEM_CHECK(module_ != nullptr && group_ != nullptr, "DistributedDataParallel: module and group are required");
  register_module("module", module_);
  verify_same_model();
  broadcast_state(/*parameters=*/true, /*buffers=*/true);
  reducer_ = std::make_unique<Reducer>(module_->named_parameters(), group_, options_.reducer);
}

void DistributedDataParallel::verify_same_model() {
  const nn::NamedTensors state = module_->state_dict();
  // First the count, then one fingerprint per tensor, gathered from every rank (on the group's
  // device: NCCL takes nothing else).
  const auto counts = allgather_values(*group_, {static_cast<double>(state.size())},
                                       "DistributedDataParallel: the model check (tensor counts)");
  for (int r = 0; r < group_->size(); ++r)
    TANDEM_CHECK(counts[r][0] == static_cast<double>(state.size()), "DistributedDataParallel: rank ", r, " has ",
                 counts[r][0], " parameters and buffers, this rank (", group_->rank(), ") has ", state.size(),
                 "; every rank must build the same model");
  std::vector<double> mine;
  for (const auto& [name, t] : state) mine.push_back(fingerprint(name, t));
  const auto all = allgather_values(*group_, mine, "DistributedDataParallel: the model check (fingerprints)");
  for (int r = 0; r < group_->size(); ++r)
    for (size_t i = 0; i < mine.size(); ++i)
      TANDEM_CHECK(all[r][i] == mine[i], "DistributedDataParallel: tensor ", i, " ('", state[i].first, "', ",
                   state[i].second.str(), " here) differs on rank ", r,
                   " in name, shape or dtype; every rank must build the same model");
}

// Rank 0's values of the tensors, one broadcast per dtype. A tensor already on the group's device
// is copied into the flat message and back on that device (NCCL: no host round trip); others
// cross to it and back (CPU buffers over NCCL, CUDA buffers over Gloo).
void DistributedDataParallel::broadcast_state(bool parameters, bool buffers, int root) {
  if (group_->size() == 1) return;
  NoGradGuard no_grad;
  std::vector<Tensor> tensors;
  if (parameters)
    for (auto& [n, t] : module_->named_parameters()) tensors.push_back(t);
  if (buffers)
    for (auto& [n, t] : module_->named_buffers()) tensors.push_back(t);
  const Device device = group_->comm_device();
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (auto& t : tensors)
    if (t.numel() > 0) by_dtype[t.dtype()].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    int64_t total = 0;
    for (auto& t : group) total += t.numel();
    Tensor flat = Tensor::empty({total}, dtype, device);
    int64_t off = 0;
    for (auto& t : group) {
      flat.slice(0, off, off + t.numel()).view(t.shape()).copy_(t);
      off += t.numel();
    }
    group_->broadcast(flat, root)->wait(group_->timeout());
    off = 0;
    for (auto& t : group) {
      t.copy_(flat.slice(0, off, off + t.numel()).view(t.shape()));
      off += t.numel();
    }
  }
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  int buffer_root = 0;
  if (join_enabled_) {
    const JoinNotice notice = exchange_join_notice(/*joined=*/false, /*terminate=*/false);
    TANDEM_CHECK(!notice.terminate, "DistributedDataParallel: a rank ran out of inputs and asked every rank to stop "
                                    "(Join with throw_on_early_termination)");
    buffer_root = notice.authoritative;
  }
  if (GradMode::enabled()) reducer_->prepare_for_forward();
  if (options_.broadcast_buffers && is_training()) broadcast_state(/*parameters=*/false, /*buffers=*/true, buffer_root);
  Tensor out = module_->forward(x);
  if (GradMode::enabled() && is_training()) reducer_->prepare_for_backward({out});
  return out;
}

DistributedDataParallel::JoinNotice DistributedDataParallel::exchange_join_notice(bool joined, bool terminate) {
  const int world = group_->size();
  std::vector<double> v(4 + static_cast<size_t>(world), 0.0);
  if (!joined) {
    v[0] = 1;
    v[1] = GradMode::enabled() && is_training() && reducer_->require_sync() ? 1 : 0;
    v[3] = options_.broadcast_buffers && is_training() ? 1 : 0;
    v[4 + static_cast<size_t>(group_->rank())] = 1;
  }
  v[2] = terminate ? 1 : 0;
  const std::vector<double> all = allreduce_values(*group_, v, ReduceOp::Sum, "Join: the ranks' join notice");
  JoinNotice n;
  n.active = static_cast<int>(all[0]);
  n.sync = all[1] > 0;
  n.terminate = all[2] > 0;
  n.buffers = all[3] > 0;
  for (int r = 0; r < world; ++r)
    if (all[4 + static_cast<size_t>(r)] > 0) n.authoritative = r;
  return n;
}

void DistributedDataParallel::shadow_iteration(const JoinNotice& notice) {
  reducer_->prepare_for_forward();
  if (notice.buffers) broadcast_state(/*parameters=*/false, /*buffers=*/true, notice.authoritative);
  if (notice.sync) reducer_->shadow_backward();
}

}  // namespace tandem::dist
