// ZeroRedundancyOptimizer (dist/parallel/zero_redundancy_optimizer.h): the partition, the local step and
// the shard broadcasts, and the state dict consolidated on one rank. Consolidation sends each
// rank's local state as PyTorch's does, by broadcast from its owner (every rank takes part; the
// ones that are not the target drop what they receive): first the layout of its entries as host
// values (dist/group/host_values.h), then each state tensor on the group's device.
#include "dist/parallel/zero_redundancy_optimizer.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <numeric>

#include "core/autograd.h"
#include "dist/group/host_values.h"

namespace tandem::dist {
namespace {

constexpr const char* kWho = "ZeroRedundancyOptimizer";

// "state.<i>.<field>" -> (i, field); false for any other key.
bool parse_state_key(const std::string& key, size_t& index, std::string& field) {
  if (key.rfind("state.", 0) != 0) return false;
  const size_t dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6 || dot + 1 >= key.size()) return false;
  for (size_t k = 6; k < dot; ++k)
    if (!std::isdigit(static_cast<unsigned char>(key[k]))) return false;
  index = std::stoul(key.substr(6, dot - 6));
  field = key.substr(dot + 1);
  return true;
}

std::string state_key(size_t index, const std::string& field) {
  return "state." + std::to_string(index) + "." + field;
}

void wait_all(ProcessGroup& group, std::vector<std::shared_ptr<Work>>& works, const std::string& what) {
  for (auto& w : works) {
    try {
      w->wait(group.timeout());
    } catch (const Error& e) {
      TANDEM_FAIL(kWho, ": ", what, " over the ", group.backend(), " group (rank ", group.rank(), " of ",
                  group.size(), ") failed: ", e.what());
    }
  }
  works.clear();
}

// A 52-bit fingerprint (exact in a double) of the groups' parameter sizes.
double layout_fingerprint(const std::vector<std::vector<int64_t>>& numels) {
  std::string text;
  for (auto& g : numels) {
    for (int64_t n : g) text += std::to_string(n) + ",";
    text += "|";
  }
  return static_cast<double>(std::hash<std::string>{}(text) & ((uint64_t{1} << 52) - 1));
}

}  // namespace

std::vector<std::vector<std::vector<size_t>>> zero_partition(const std::vector<std::vector<int64_t>>& numels,
                                                             int world) {
  TANDEM_CHECK(world > 0, kWho, ": the world size must be positive, got ", world);
  std::vector<std::vector<std::vector<size_t>>> out(static_cast<size_t>(world),
                                                    std::vector<std::vector<size_t>>(numels.size()));
  std::vector<int64_t> sizes(static_cast<size_t>(world), 0);
  size_t base = 0;
  for (size_t g = 0; g < numels.size(); ++g) {
    std::vector<size_t> order(numels[g].size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[g][a] > numels[g][b]; });
    for (size_t k : order) {
      const size_t rank = static_cast<size_t>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
      out[rank][g].push_back(base + k);
      sizes[rank] += numels[g][k];
    }
    base += numels[g].size();
  }
  return out;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, LocalFactory make_local,
                                                 std::shared_ptr<ProcessGroup> group, ZeroOptions options)
    : Optimizer(std::move(groups), kWho), group_(std::move(group)), options_(options) {
  TANDEM_CHECK(group_ != nullptr, kWho, ": a process group is required");
  TANDEM_CHECK(make_local != nullptr, kWho,
               ": a local optimizer factory is required (e.g. local_optimizer<optim::Adam>)");
  std::map<const void*, std::pair<size_t, size_t>> seen;  // parameter -> (group, position)
  std::vector<std::vector<int64_t>> numels;
  for (size_t g = 0; g < groups_.size(); ++g) {
    numels.emplace_back();
    for (size_t k = 0; k < groups_[g].params.size(); ++k) {
      const Tensor& p = groups_[g].params[k];
      auto [it, fresh] = seen.emplace(p.impl_ptr().get(), std::make_pair(g, k));
      TANDEM_CHECK(fresh, kWho, ": parameter ", p.str(), " is in group ", it->second.first, " at position ",
                   it->second.second, " and again in group ", g, " at position ", k,
                   "; each parameter must appear once, in one group");
      all_.push_back(p);
      numels.back().push_back(p.numel());
    }
  }
  // Every rank must shard the same list, or the broadcasts would not pair up.
  const double n = static_cast<double>(all_.size()), fp = layout_fingerprint(numels);
  const auto seen_by = allgather_values(*group_, {n, fp}, std::string(kWho) + ": the parameter check");
  for (int r = 0; r < group_->size(); ++r)
    TANDEM_CHECK(seen_by[r][0] == n && seen_by[r][1] == fp, kWho, ": rank ", r, " has ", seen_by[r][0],
                 " parameters, this rank (", group_->rank(), ") has ", n,
                 (seen_by[r][0] == n ? " but their groups or sizes differ" : ""),
                 "; every rank must pass the same parameter groups");

  const auto partition = zero_partition(numels, group_->size());
  owner_.assign(all_.size(), -1);
  local_index_.assign(all_.size(), 0);
  shards_.assign(partition.size(), {});
  for (size_t r = 0; r < partition.size(); ++r)
    for (auto& indices : partition[r])
      for (size_t i : indices) {
        owner_[i] = static_cast<int>(r);
        local_index_[i] = shards_[r].size();
        shards_[r].push_back(i);
      }

  const auto& mine = partition[static_cast<size_t>(group_->rank())];
  if (!shards_[static_cast<size_t>(group_->rank())].empty()) {
    std::vector<optim::ParamGroup> local_groups;
    for (size_t g = 0; g < groups_.size(); ++g) {
      optim::ParamGroup lg;
      for (size_t i : mine[g]) lg.params.push_back(all_[i]);
      lg.lr = groups_[g].lr;
      lg.weight_decay = groups_[g].weight_decay;
      local_groups.push_back(std::move(lg));
    }
    local_ = make_local(std::move(local_groups));
    TANDEM_CHECK(local_ != nullptr, kWho, ": the local optimizer factory returned nothing");
    auto& lg = local_->param_groups();
    bool kept = lg.size() == groups_.size();
    for (size_t g = 0; kept && g < lg.size(); ++g) {
      kept = lg[g].params.size() == mine[g].size();
      for (size_t k = 0; kept && k < mine[g].size(); ++k) kept = lg[g].params[k].is_same(all_[mine[g][k]]);
    }
    TANDEM_CHECK(kept, kWho, ": the local optimizer (", local_->param_groups().size(),
                 " groups) does not hold the groups it was given (", groups_.size(),
                 "); build it from the groups passed to the factory");
  }
  if (options_.parameters_as_bucket_view) build_buckets();
}

void ZeroRedundancyOptimizer::build_buckets() {
  const Device device = group_->comm_device();
  const DType dtype = all_.front().dtype();
  for (size_t i = 0; i < all_.size(); ++i)
    TANDEM_CHECK(all_[i].device() == device && all_[i].dtype() == dtype && all_[i].is_contiguous(), kWho,
                 ": parameters_as_bucket_view needs every parameter contiguous, of one dtype and on the ",
                 group_->backend(), " group's device (", device.str(), ", ", dtype_name(dtype), "); parameter ",
                 i, " is ", all_[i].str(), " (turn the option off, or move the model first)");
  NoGradGuard no_grad;
  buckets_.assign(shards_.size(), Tensor());
  for (size_t r = 0; r < shards_.size(); ++r) {
    int64_t total = 0;
    for (size_t i : shards_[r]) total += all_[i].numel();
    if (total == 0) continue;
    buckets_[r] = Tensor::empty({total}, dtype, device);
    int64_t off = 0;
    for (size_t i : shards_[r]) {
      Tensor& p = all_[i];
      Tensor view = buckets_[r].slice(0, off, off + p.numel()).view(p.shape());
      view.copy_(p);
      p.set_data(view);  // every handle of this parameter (the model's, the local optimizer's) sees it
      off += p.numel();
    }
  }
}

void ZeroRedundancyOptimizer::sync_groups_to_local() {
  if (!local_) return;
  auto& lg = local_->param_groups();
  for (size_t g = 0; g < groups_.size(); ++g) {
    lg[g].lr = groups_[g].lr;
    lg[g].weight_decay = groups_[g].weight_decay;
  }
}

void ZeroRedundancyOptimizer::broadcast_shard(int owner, std::vector<std::shared_ptr<Work>>& works,
                                              std::vector<Tensor>& staged) {
  if (options_.parameters_as_bucket_view) {
    Tensor& bucket = buckets_[static_cast<size_t>(owner)];
    if (bucket.defined()) works.push_back(group_->broadcast(bucket, owner));
    return;
  }
  const Device device = group_->comm_device();
  for (size_t i : shards_[static_cast<size_t>(owner)]) {
    Tensor& p = all_[i];
    if (p.numel() == 0) continue;
    if (p.device() == device && p.is_contiguous()) {
      works.push_back(group_->broadcast(p, owner));
      continue;
    }
    // Across to the group's device and back: staged[2k] the parameter, staged[2k + 1] its copy.
    Tensor copy = Tensor::empty(p.shape(), p.dtype(), device);
    if (owner == group_->rank()) copy.copy_(p);
    works.push_back(group_->broadcast(copy, owner));
    staged.push_back(p);
    staged.push_back(copy);
  }
}

void ZeroRedundancyOptimizer::step() {
  sync_groups_to_local();
  if (local_) local_->step();
  NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> works;
  std::vector<Tensor> staged;
  for (int r = 0; r < group_->size(); ++r) broadcast_shard(r, works, staged);
  wait_all(*group_, works, "broadcasting the updated parameter shards");
  for (size_t k = 0; k < staged.size(); k += 2) staged[k].copy_(staged[k + 1]);
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  TANDEM_CHECK(to >= 0 && to < group_->size(), kWho, ": consolidate_state_dict(to=", to,
               ") names no rank of this group (size ", group_->size(), ")");
  sync_groups_to_local();
  const int me = group_->rank();
  const Device device = group_->comm_device();
  std::map<std::string, Tensor> gathered;
  for (int owner = 0; owner < group_->size(); ++owner) {
    // The owner's entries, keys made overall: [index, dtype, ndim, dims..., name length, name...].
    std::vector<std::pair<std::string, Tensor>> entries;
    std::vector<double> layout;
    if (owner == me && local_) {
      const auto& shard = shards_[static_cast<size_t>(me)];
      for (auto& [key, t] : local_->state_dict()) {
        size_t j = 0;
        std::string field;
        if (!parse_state_key(key, j, field)) continue;  // the groups' settings come from this object
        TANDEM_CHECK(j < shard.size(), kWho, ": the local optimizer has state '", key, "' but holds ", shard.size(),
                     " parameters");
        layout.push_back(static_cast<double>(shard[j]));
        layout.push_back(static_cast<double>(static_cast<int>(t.dtype())));
        layout.push_back(static_cast<double>(t.dim()));
        for (int64_t d : t.shape()) layout.push_back(static_cast<double>(d));
        layout.push_back(static_cast<double>(field.size()));
        for (char c : field) layout.push_back(static_cast<double>(static_cast<unsigned char>(c)));
        entries.emplace_back(state_key(shard[j], field), t);
      }
    }
    const std::string what = "consolidating rank " + std::to_string(owner) + "'s optimizer state";
    const auto length = broadcast_values(*group_, {static_cast<double>(layout.size())}, owner, what);
    if (length[0] == 0) continue;
    if (owner != me) layout.assign(static_cast<size_t>(length[0]), 0.0);
    layout = broadcast_values(*group_, layout, owner, what);
    if (owner != me) {
      for (size_t k = 0; k < layout.size();) {
        const size_t index = static_cast<size_t>(layout[k++]);
        const DType dtype = static_cast<DType>(static_cast<int>(layout[k++]));
        Shape shape(static_cast<size_t>(layout[k++]));
        for (auto& d : shape) d = static_cast<int64_t>(layout[k++]);
        std::string field(static_cast<size_t>(layout[k++]), ' ');
        for (auto& c : field) c = static_cast<char>(static_cast<int>(layout[k++]));
        entries.emplace_back(state_key(index, field), Tensor::empty(shape, dtype, device));
      }
    }
    std::vector<std::shared_ptr<Work>> works;
    std::vector<Tensor> messages;
    for (auto& [key, t] : entries) {
      messages.push_back(t.to(device).contiguous());
      works.push_back(group_->broadcast(messages.back(), owner));
    }
    wait_all(*group_, works, what);
    if (me == to)
      for (size_t k = 0; k < entries.size(); ++k) {
        Tensor host = messages[k].to(Device::cpu());
        gathered[entries[k].first] = host.is_same(entries[k].second) ? host.clone() : host;
      }
  }
  consolidated_ = std::move(gathered);
  has_consolidated_ = me == to;
}

std::map<std::string, Tensor> ZeroRedundancyOptimizer::state_dict() const {
  TANDEM_CHECK(has_consolidated_, kWho, ": the optimizer state has not been consolidated on rank ", group_->rank(),
               "; call consolidate_state_dict(", group_->rank(), ") on every rank first");
  std::map<std::string, Tensor> out = consolidated_;
  for (size_t g = 0; g < groups_.size(); ++g)
    out["group." + std::to_string(g) + ".lr"] = Tensor::scalar(groups_[g].lr, kFloat64);
  return out;
}

void ZeroRedundancyOptimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::map<std::string, Tensor> local;
  std::vector<double> lrs;
  for (size_t g = 0; g < groups_.size(); ++g) lrs.push_back(groups_[g].lr);
  for (auto& [key, t] : state) {
    if (key.rfind("group.", 0) == 0) {
      for (size_t g = 0; g < groups_.size(); ++g)
        if (key == "group." + std::to_string(g) + ".lr") lrs[g] = t.item<double>();
      continue;
    }
    size_t i = 0;
    std::string field;
    TANDEM_CHECK(parse_state_key(key, i, field), kWho, ": unexpected optimizer state key '", key,
                 "'; expected state.<index>.<name> or group.<index>.lr");
    TANDEM_CHECK(i < all_.size(), kWho, ": state '", key, "' is for parameter ", i, " but there are only ",
                 all_.size(), " parameters");
    TANDEM_CHECK(field == "step" || t.shape() == all_[i].shape(), kWho, ": state '", key, "' has shape ",
                 shape_str(t.shape()), ", expected ", shape_str(all_[i].shape()), " (parameter ", i, ")");
    if (owner_[i] == group_->rank()) local[state_key(local_index_[i], field)] = t;
  }
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].lr = lrs[g];
  if (local_) {
    local_->load_state_dict(local);
    sync_groups_to_local();
  }
}

int64_t ZeroRedundancyOptimizer::state_bytes() const { return local_ ? local_->state_bytes() : 0; }

}  // namespace tandem::dist
