// FullyShardedDataParallel's checkpoints (see fsdp.h): the full one (rank 0 writes the module's state
// dict as safetensors, PyTorch's names) and the sharded one (a file per rank plus fsdp.json, with
// the optimizer's state over the shards; loaded bitwise on the same world size, re-sharded onto
// another).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/autograd.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "dist/parallel/fsdp.h"
#include "dist/parallel/fsdp_checkpoint.h"
#include "dist/parallel/fsdp_unit.h"
#include "optim/optimizer.h"

namespace tandem::dist {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string shard_file(const std::string& dir, int rank, int world) {
  return (fs::path(dir) / ("shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors")).string();
}

// Writes through a temporary name and renames, so a crash never leaves a half-written file under the
// final name (and an older checkpoint there survives until the new one is whole).
void save_atomically(const std::string& path, const TensorMap& tensors) {
  const std::string tmp = path + ".tmp";
  save_safetensors(tmp, tensors);
  fs::rename(tmp, path);
}

// Elements [lo, lo + n) of the unit's unpadded flat values, assembled from the old shards.
Tensor gather_old(const std::vector<TensorMap>& old, const std::string& key, int64_t old_shard, int64_t lo, int64_t n,
                  const std::string& dir) {
  Tensor out = Tensor::zeros({n}, old.front().at(key).dtype());
  for (int64_t i = 0; i < n;) {
    const int64_t at = lo + i;
    const int64_t r = at / old_shard, off = at % old_shard;
    TANDEM_CHECK(r < static_cast<int64_t>(old.size()), "FSDP checkpoint ", dir, ": '", key, "' needs element ", at,
                 " but the checkpoint's ", old.size(), " shards hold ", old.size() * old_shard);
    const Tensor& src = old[static_cast<size_t>(r)].at(key);
    const int64_t take = std::min(n - i, old_shard - off);
    out.slice(0, i, i + take).copy_(src.slice(0, off, off + take));
    i += take;
  }
  return out;
}

// <dir>/fsdp.json, checked to be a sharded checkpoint's index.
json read_index(const std::string& dir) {
  const std::string index = (fs::path(dir) / "fsdp.json").string();
  std::ifstream in(index);
  TANDEM_CHECK(in.good(), "FSDP checkpoint: ", index, " does not exist (a sharded checkpoint is a directory written by "
                          "save_sharded: fsdp.json and one shard file per rank)");
  json meta;
  try {
    meta = json::parse(in);
  } catch (const std::exception& e) {
    TANDEM_FAIL("FSDP checkpoint: ", index, " is not valid JSON (", e.what(), ")");
  }
  TANDEM_CHECK(meta.is_object() && meta.value("format", "") == "tandem-fsdp-sharded", "FSDP checkpoint: ", index,
               " is not a sharded FSDP index (format '", meta.is_object() ? meta.value("format", "") : "", "')");
  return meta;
}

// Every rank's shard file of the checkpoint, in rank order, loaded (and so CRC-checked).
std::vector<TensorMap> read_all_shards(const std::string& dir, const json& meta) {
  const int world = meta.at("world_size").get<int>();
  std::vector<TensorMap> out;
  for (int r = 0; r < world; ++r) {
    const std::string path = shard_file(dir, r, world);
    TANDEM_CHECK(fs::exists(path), "FSDP checkpoint ", dir, ": ", path, " is missing (written with ", world,
                 " ranks; every rank's file is needed)");
    out.push_back(load_safetensors(path));
  }
  return out;
}

}  // namespace

void verify_sharded_checkpoint(const std::string& dir) { read_all_shards(dir, read_index(dir)); }

TensorMap load_sharded_state_dict(const std::string& dir) {
  const json meta = read_index(dir);
  const std::vector<TensorMap> shards = read_all_shards(dir, meta);
  TensorMap out;
  const json& units = meta.at("units");
  for (size_t k = 0; k < units.size(); ++k) {
    const std::string key = "param." + std::to_string(k);
    // The shards end to end (NO_SHARD: every rank holds all of it, rank 0's comes first).
    int64_t total = 0;
    for (const TensorMap& s : shards) {
      TANDEM_CHECK(s.count(key) == 1, "FSDP checkpoint ", dir, ": a shard file has no '", key, "'");
      total += s.at(key).numel();
    }
    Tensor flat = Tensor::zeros({total}, shards.front().at(key).dtype());
    int64_t at = 0;
    for (const TensorMap& s : shards) {
      const Tensor& part = s.at(key);
      flat.slice(0, at, at + part.numel()).copy_(part.reshape({part.numel()}));
      at += part.numel();
    }
    at = 0;
    for (const json& p : units[k].at("params")) {
      const Shape shape = p.at("shape").get<Shape>();
      const int64_t n = shape_numel(shape);
      TANDEM_CHECK(at + n <= flat.numel(), "FSDP checkpoint ", dir, ": unit ", k, "'s shards hold ", flat.numel(),
                   " elements, fewer than its parameters need");
      out[p.at("name").get<std::string>()] = flat.slice(0, at, at + n).reshape(shape).clone();
      at += n;
    }
  }
  for (const auto& [name, t] : shards.front())
    if (name.rfind("buffer.", 0) == 0) out[name.substr(7)] = t;
  return out;
}

namespace {
}  // namespace

void FullyShardedDataParallel::save_full(const std::string& path) {
  gather_full_params();
  try {
    if (group_->rank() == 0) {
      TensorMap out;
      for (auto& [name, t] : module_->state_dict()) out[name] = t;
      save_atomically(path, out);
    }
  } catch (...) {
    release_full_params();
    throw;
  }
  release_full_params();
  group_->barrier()->wait(group_->timeout());  // the file is whole when any rank returns
}

namespace {

// The unit a "state.<k>.<field>" key belongs to, and the field; {-1, ""} for other keys.
std::pair<int64_t, std::string> state_key(const std::string& key) {
  if (key.rfind("state.", 0) != 0) return {-1, ""};
  const size_t dot = key.find('.', 6);
  if (dot == std::string::npos) return {-1, ""};
  return {std::stoll(key.substr(6, dot - 6)), key.substr(dot + 1)};
}

}  // namespace

const FullyShardedDataParallel::Unit* FullyShardedDataParallel::per_element_unit(const std::string& key,
                                                                                   const Tensor& t,
                                                                                   bool full) const {
  if (!sharded()) return nullptr;
  const auto [k, field] = state_key(key);
  if (k < 0 || k >= static_cast<int64_t>(units_.size()) || field == "step") return nullptr;
  const Unit& u = *units_[static_cast<size_t>(k)];
  return t.numel() == (full ? u.numel : u.shard_numel) ? &u : nullptr;
}

std::map<std::string, Tensor> FullyShardedDataParallel::full_optimizer_state(const optim::Optimizer& optimizer) {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> out;
  for (auto& [key, t] : optimizer.state_dict()) {
    const Unit* unit = per_element_unit(key, t, /*full=*/false);
    if (!unit) {
      out[key] = t;
      continue;
    }
    const Unit& u = *unit;
    // Under cpu_offload the state is in host memory: gathered on the unit's device, as the shards are.
    Tensor full = Tensor::empty({u.total}, t.dtype(), u.device);
    group_->all_gather_into_tensor(full, t.to(u.device).contiguous())->wait(group_->timeout());
    out[key] = full.slice(0, 0, u.numel).to(t.device()).clone();
  }
  return out;
}

std::map<std::string, Tensor> FullyShardedDataParallel::shard_optimizer_state(
    const std::map<std::string, Tensor>& full) const {
  std::map<std::string, Tensor> out;
  for (auto& [key, t] : full) {
    const Unit* unit = per_element_unit(key, t, /*full=*/true);
    if (!unit) {
      out[key] = t;
      continue;
    }
    const Unit& u = *unit;
    const int64_t lo = group_->rank() * u.shard_numel;
    const int64_t n = std::max<int64_t>(0, std::min(u.shard_numel, u.numel - lo));
    Tensor mine = Tensor::zeros({u.shard_numel}, t.dtype(), u.shard.device());
    if (n > 0) mine.slice(0, 0, n).copy_(t.reshape({t.numel()}).slice(0, lo, lo + n));
    out[key] = mine;
  }
  return out;
}

nn::NamedTensors FullyShardedDataParallel::unshard_tensors(const std::vector<Tensor>& shards) {
  TANDEM_CHECK(shards.size() == units_.size(), "FullyShardedDataParallel::unshard_tensors: ", shards.size(),
               " tensors for ", units_.size(), " units (one per parameters() entry expected)");
  NoGradGuard no_grad;
  nn::NamedTensors out;
  for (size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = *units_[k];
    const Tensor& t = shards[k];
    TANDEM_CHECK(t.numel() == u.shard_numel, "FullyShardedDataParallel::unshard_tensors: tensor ", k, " has ",
                 t.numel(), " elements, ", u.describe(), " has ", u.shard_numel, " a rank");
    Tensor full = t.to(u.device).contiguous();
    if (sharded()) {  // under cpu_offload gathered on the unit's device, as the shards are
      full = Tensor::empty({u.total}, t.dtype(), u.device);
      group_->all_gather_into_tensor(full, t.to(u.device).contiguous())->wait(group_->timeout());
    }
    full = full.reshape({full.numel()});
    for (size_t i = 0; i < u.params.size(); ++i) {
      const Tensor& p = u.params[i].second;
      out.emplace_back(u.params[i].first,
                       full.slice(0, u.offsets[i], u.offsets[i] + p.numel()).reshape(p.shape()).to(t.device()).clone());
    }
  }
  return out;
}

std::vector<Tensor> FullyShardedDataParallel::shard_tensors(const std::map<std::string, Tensor>& full) const {
  NoGradGuard no_grad;
  std::vector<Tensor> out;
  for (const auto& unit : units_) {
    const Unit& u = *unit;
    Tensor flat = Tensor::zeros({u.total}, u.shard.dtype(), u.shard.device());
    for (size_t i = 0; i < u.params.size(); ++i) {
      const auto& [name, p] = u.params[i];
      const auto it = full.find(name);
      TANDEM_CHECK(it != full.end(), "FullyShardedDataParallel::shard_tensors: no tensor for parameter '", name,
                   "'");
      TANDEM_CHECK(it->second.shape() == p.shape(), "FullyShardedDataParallel::shard_tensors: '", name,
                   "' is ", it->second.str(), ", the module's parameter ", p.str());
      flat.slice(0, u.offsets[i], u.offsets[i] + p.numel()).copy_(it->second.reshape({p.numel()}));
    }
    const int64_t lo = sharded() ? group_->rank() * u.shard_numel : 0;
    out.push_back(flat.slice(0, lo, lo + u.shard_numel).clone());
  }
  return out;
}

void FullyShardedDataParallel::save_sharded(const std::string& dir, const optim::Optimizer* optimizer) {
  TANDEM_CHECK(phase_ == Phase::Idle || phase_ == Phase::AfterForward,
               "FullyShardedDataParallel::save_sharded: called during forward or between gather_full_params() "
               "and release_full_params()");
  const int rank = group_->rank(), world = group_->size();
  // HYBRID_SHARD: every node holds the same shards (and, stepped on the same gradients, the same
  // optimizer state); the first node writes them, named by the rank in the node.
  const bool writer = !hybrid() || options_.replicate_group->rank() == 0;
  fs::create_directories(dir);
  if (writer) {
    TensorMap mine;
    for (size_t k = 0; k < units_.size(); ++k) mine["param." + std::to_string(k)] = units_[k]->shard.detach();
    for (auto& [name, b] : module_->named_buffers()) mine["buffer." + name] = b.detach();  // this rank's own
    if (optimizer)
      for (auto& [key, t] : optimizer->state_dict()) mine["optim." + key] = t;
    save_atomically(shard_file(dir, rank, world), mine);
  }
  barrier_all();  // every shard is written before the index says so
  if (rank == 0 && writer) {
    json meta = {{"format", "tandem-fsdp-sharded"}, {"version", 1}, {"world_size", world},
                 {"replicas", hybrid() ? options_.replicate_group->size() : 1},
                 {"sharding_strategy", sharding_strategy_name(options_.sharding_strategy)},
                 {"optimizer", optimizer != nullptr}, {"units", json::array()}};
    for (auto& u : units_) {
      json unit = {{"path", u->path}, {"numel", u->numel}, {"shard_numel", u->shard_numel},
                   {"dtype", dtype_name(u->dtype)}, {"params", json::array()}};
      for (auto& [name, p] : u->params) unit["params"].push_back({{"name", name}, {"shape", p.shape()}});
      meta["units"].push_back(unit);
    }
    const std::string path = (fs::path(dir) / "fsdp.json").string();
    std::ofstream(path + ".tmp") << meta.dump(1) << "\n";
    fs::rename(path + ".tmp", path);
  }
  barrier_all();
}

void FullyShardedDataParallel::barrier_all() {
  group_->barrier()->wait(group_->timeout());
  if (hybrid()) options_.replicate_group->barrier()->wait(options_.replicate_group->timeout());
}

void FullyShardedDataParallel::load_sharded(const std::string& dir, optim::Optimizer* optimizer) {
  TANDEM_CHECK(phase_ == Phase::Idle || phase_ == Phase::AfterForward,
               "FullyShardedDataParallel::load_sharded: called during forward or between gather_full_params() "
               "and release_full_params()");
  const json meta = read_index(dir);
  const int old_world = meta.at("world_size").get<int>();
  const json& units = meta.at("units");
  TANDEM_CHECK(units.size() == units_.size(), "FSDP checkpoint ", dir, ": it has ", units.size(),
               " units, this model has ", units_.size(), " (the same model and auto_wrap_policy are needed)");
  for (size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = *units_[k];
    const json& saved = units[k];
    TANDEM_CHECK(saved.at("path").get<std::string>() == u.path && saved.at("numel").get<int64_t>() == u.numel &&
                     saved.at("params").size() == u.params.size(),
                 "FSDP checkpoint ", dir, ": unit ", k, " was '", saved.at("path").get<std::string>(), "' with ",
                 saved.at("numel").get<int64_t>(), " elements, here it is ", u.describe(), " with ", u.numel);
    for (size_t i = 0; i < u.params.size(); ++i)
      TANDEM_CHECK(saved["params"][i].at("name").get<std::string>() == u.params[i].first &&
                       saved["params"][i].at("shape").get<Shape>() == u.params[i].second.shape(),
                   "FSDP checkpoint ", dir, ": parameter ", i, " of unit '", u.path, "' was '",
                   saved["params"][i].at("name").get<std::string>(), "' ",
                   shape_str(saved["params"][i].at("shape").get<Shape>()), ", here '", u.params[i].first, "' ",
                   shape_str(u.params[i].second.shape()));
  }
  std::vector<TensorMap> old;
  const int wanted = old_world == group_->size() ? 1 : old_world;  // the same world reads only its own file
  for (int r = 0; r < wanted; ++r) {
    const int file_rank = old_world == group_->size() ? group_->rank() : r;
    const std::string path = shard_file(dir, file_rank, old_world);
    TANDEM_CHECK(fs::exists(path), "FSDP checkpoint ", dir, ": ", path, " is missing (written with ", old_world,
                 " ranks; every rank's file is needed)");
    try {
      old.push_back(load_safetensors(path));
    } catch (const SafetensorsError& e) {  // a changed byte, a truncation: the checksums or the header say so
      TANDEM_FAIL("FSDP checkpoint ", dir, " is damaged: ", e.what(), "; load an earlier checkpoint");
    }
  }
  NoGradGuard no_grad;
  std::map<std::string, Tensor> opt_state;
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = *units_[k];
    const std::string key = "param." + std::to_string(k);
    const int64_t old_shard = units[k].at("shard_numel").get<int64_t>();
    const int64_t lo = sharded() ? group_->rank() * u.shard_numel : 0;
    const int64_t n = std::max<int64_t>(0, std::min(u.shard_numel, u.numel - lo));
    Tensor values = wanted == 1 ? old[0].at(key) : gather_old(old, key, old_shard, lo, n, dir);
    Tensor dst = u.shard.detach();
    dst.zero_();
    dst.slice(0, 0, std::min(values.numel(), dst.numel())).copy_(values.slice(0, 0, std::min(values.numel(), dst.numel())));
    if (!optimizer) continue;
    const std::string prefix = "optim.state." + std::to_string(k) + ".";
    for (auto& [name, t] : old[0]) {
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string field = name.substr(prefix.size());
      if (field == "step" || wanted == 1) {
        opt_state[name.substr(6)] = t;
        continue;
      }
      Tensor s = Tensor::zeros(u.shard.shape(), t.dtype());
      s.slice(0, 0, n).copy_(gather_old(old, name, old_shard, lo, n, dir));
      opt_state[name.substr(6)] = s;
    }
  }
  // The buffers: this rank's own on the same world size, rank 0's on another (older files have none).
  for (auto& [name, b] : module_->named_buffers()) {
    const auto it = old[0].find("buffer." + name);
    if (it != old[0].end()) b.detach().copy_(it->second);
  }
  if (optimizer) {
    for (auto& [name, t] : old[0])
      if (name.rfind("optim.group.", 0) == 0) opt_state[name.substr(6)] = t;
    TANDEM_CHECK(meta.value("optimizer", false), "FSDP checkpoint ", dir,
                 ": it holds no optimizer state (saved without an optimizer)");
    optimizer->load_state_dict(opt_state);
  }
  group_->barrier()->wait(group_->timeout());
}

}  // namespace tandem::dist
