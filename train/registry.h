// Registries by name, as MMEngine's (MODELS, MODEL_WRAPPERS, OPTIMIZERS, PARAM_SCHEDULERS, HOOKS):
// a config names a type, the Runner looks its factory up here. An embedding program adds its own
// types with register_module (a custom DDP wrapper, a model, a hook) before building a Runner.
// Kwargs are the keyword arguments of one config entry (everything beside "type"), each kept as its
// JSON text so that this header needs no JSON library; the accessors parse and type-check them.
// Errors are tandem::Error: an unknown type names the registry and every registered name; a bad
// argument names the entry, the key and the expected type.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace tandem::train {

class Kwargs {
 public:
  Kwargs() = default;
  // `owner` names the config entry in errors ("optim_wrapper.optimizer").
  explicit Kwargs(std::string owner) : owner_(std::move(owner)) {}
  // Sets key to a JSON value given as text ("0.5", "true", "\"fp16\"").
  void set_json(const std::string& key, const std::string& json_text) { values_[key] = json_text; }
  void set(const std::string& key, double v);
  void set(const std::string& key, bool v);
  void set(const std::string& key, const std::string& v);
  void set(const std::string& key, const char* v) { set(key, std::string(v)); }
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  double number(const std::string& key, double fallback) const;
  int64_t integer(const std::string& key, int64_t fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  const std::map<std::string, std::string>& items() const { return values_; }
  const std::string& owner() const { return owner_; }
  // Throws naming the first key not in `known` (and listing `known`).
  void check_known(const std::vector<std::string>& known) const;

 private:
  std::string owner_ = "kwargs";
  std::map<std::string, std::string> values_;
};

template <typename Factory>
class Registry {
 public:
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds `name`; throws when it is taken unless `force` (then it replaces the old one).
  void register_module(const std::string& name, Factory factory, bool force = false) {
    std::lock_guard<std::mutex> lock(mu_);
    TANDEM_CHECK(force || factories_.count(name) == 0, kind_, ": '", name,
                 "' is already registered; pass force=true to replace it");
    factories_[name] = std::move(factory);
  }
  bool contains(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    return factories_.count(name) > 0;
  }
  // The factory of `name`; an unknown name throws one line naming the registered ones.
  Factory get(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = factories_.find(name);
    if (it == factories_.end()) {
      std::string known;
      for (const auto& [n, f] : factories_) known += (known.empty() ? "" : ", ") + n;
      TANDEM_FAIL("unknown ", kind_, " type '", name, "'; registered: ", known.empty() ? "(none)" : known);
    }
    return it->second;
  }
  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [n, f] : factories_) out.push_back(n);
    return out;
  }
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  mutable std::mutex mu_;
  std::map<std::string, Factory> factories_;
};

}  // namespace tandem::train
