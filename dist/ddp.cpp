#include "dist/ddp.h"

#include <functional>

#include "core/autograd.h"

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
  const int world = group_->size();
  // First the count, then one fingerprint per tensor, gathered from every rank.
  Tensor count = Tensor::full({1}, static_cast<double>(state.size()), kFloat64);
  std::vector<Tensor> counts;
  for (int r = 0; r < world; ++r) counts.push_back(Tensor::empty({1}, kFloat64));
  group_->allgather(counts, count)->wait(group_->timeout());
  for (int r = 0; r < world; ++r)
    TANDEM_CHECK(counts[r].item<double>() == static_cast<double>(state.size()),
                 "DistributedDataParallel: rank ", r, " has ", counts[r].item<double>(),
                 " parameters and buffers, this rank (", group_->rank(), ") has ", state.size(),
                 "; every rank must build the same model");
  const int64_t n = static_cast<int64_t>(state.size());
  Tensor mine = Tensor::empty({n}, kFloat64);
  for (int64_t i = 0; i < n; ++i) mine.data<double>()[i] = fingerprint(state[i].first, state[i].second);
  std::vector<Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(Tensor::empty({n}, kFloat64));
  group_->allgather(all, mine)->wait(group_->timeout());
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < n; ++i)
      TANDEM_CHECK(all[r].data<double>()[i] == mine.data<double>()[i], "DistributedDataParallel: tensor ", i,
                   " ('", state[i].first, "', ", state[i].second.str(), " here) differs on rank ", r,
                   " in name, shape or dtype; every rank must build the same model");
}

void DistributedDataParallel::broadcast_state(bool parameters, bool buffers) {
  if (group_->size() == 1) return;
  NoGradGuard no_grad;
  std::vector<Tensor> tensors;
  if (parameters)
    for (auto& [n, t] : module_->named_parameters()) tensors.push_back(t);
  if (buffers)
    for (auto& [n, t] : module_->named_buffers()) tensors.push_back(t);
  if (tensors.empty()) return;
  // One flat float64 message (exact for float32 and for counters < 2^53).
  int64_t total = 0;
  for (auto& t : tensors) total += t.numel();
  Tensor flat = Tensor::empty({total}, kFloat64);
  int64_t off = 0;
  for (auto& t : tensors) {
    flat.slice(0, off, off + t.numel()).copy_(t.to(Device::cpu()).reshape({t.numel()}));
    off += t.numel();
  }
  group_->broadcast(flat, 0)->wait(group_->timeout());
  off = 0;
  for (auto& t : tensors) {
    t.copy_(flat.slice(0, off, off + t.numel()).reshape(t.shape()).to(t.dtype()).to(t.device()));
    off += t.numel();
  }
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  if (options_.broadcast_buffers && is_training()) broadcast_state(/*parameters=*/false, /*buffers=*/true);
  Tensor out = module_->forward(x);
  if (GradMode::enabled() && is_training()) reducer_->prepare_for_backward({out});
  return out;
}

}  // namespace tandem::dist
