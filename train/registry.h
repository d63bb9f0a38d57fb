// Registries by name, as MMEngine's (MODELS, MODEL_WRAPPERS, OPTIMIZERS, PARAM_SCHEDULERS, HOOKS):
// a config names a type, the Runner looks its factory up here. An embedding program adds its own
// types with register_module (a custom DDP wrapper, a model, a hook) before building a Runner.
// Kwargs are the keyword arguments of one config entry (everything beside "type"), each kept as its
// JSON text so that this header needs no JSON library; the accessors parse and type-check them.
// A registered type may own its keyword schema (ArgSpec: key, kind, default, range or choices, doc):
// the Kwargs it is built with are then checked once against it (an unknown key with "did you mean",
// a wrong kind, a value out of range) and its defaults filled in, before the factory sees them.
// Errors are tandem::Error: an unknown type names the registry and every registered name; a bad
// argument names the entry, the key and the expected type.
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
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
  // Set to something other than null (MMEngine's None: as if absent).
  bool given(const std::string& key) const { return has(key) && values_.at(key) != "null"; }
  double number(const std::string& key, double fallback) const;
  int64_t integer(const std::string& key, int64_t fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  // The same for a key that must be set: one a schema fills in (a factory's checked Kwargs), or one
  // given; an absent key throws naming it.
  double number(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  bool boolean(const std::string& key) const;
  std::string string(const std::string& key) const;
  const std::map<std::string, std::string>& items() const { return values_; }
  const std::string& owner() const { return owner_; }
  // Throws naming the first key not in `known` (and listing `known`).
  void check_known(const std::vector<std::string>& known) const;
  // Records that a command-line flag set `key` ("--lr"): errors about it then name the flag too.
  void set_origin(const std::string& key, const std::string& flag) { origins_[key] = flag; }
  // How errors name `key`: "--lr (optim_wrapper.optimizer.lr)" when a flag set it, else
  // "optim_wrapper.optimizer.lr".
  std::string label(const std::string& key) const;

 private:
  void check_set(const std::string& key) const;
  std::string owner_ = "kwargs";
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> origins_;
};

// One keyword of a registered type's schema.
enum class ArgKind { Number, Int, Bool, String, List, Dict, Any };
struct ArgSpec {
  std::string key;
  ArgKind kind = ArgKind::Any;
  std::string default_json;  // the default as JSON text ("0.9", "null"); "": none (not filled in)
  double min = -std::numeric_limits<double>::infinity(), max = std::numeric_limits<double>::infinity();
  bool min_open = false;              // min is excluded (> min)
  bool max_open = false;              // max is excluded (< max)
  std::vector<std::string> choices;   // for strings: the accepted values (empty: any)
  std::string doc;
  bool nullable = false;              // null is accepted beside the kind
  bool required = false;              // must be given (it has no default)
};
using Schema = std::vector<ArgSpec>;

// Schema builders: arg_number("lr", 1.0, "learning rate").at_least(0) ...
ArgSpec arg_number(const std::string& key, double def, const std::string& doc);
ArgSpec arg_int(const std::string& key, int64_t def, const std::string& doc);
ArgSpec arg_bool(const std::string& key, bool def, const std::string& doc);
ArgSpec arg_string(const std::string& key, const std::string& def, std::vector<std::string> choices,
                   const std::string& doc);
// A keyword of another kind (List, Dict, Any) with its default as JSON text ("" for none).
ArgSpec arg_of(const std::string& key, ArgKind kind, const std::string& default_json, const std::string& doc);
ArgSpec at_least(ArgSpec a, double min);
ArgSpec above(ArgSpec a, double min);
ArgSpec between(ArgSpec a, double min, double max);
ArgSpec below(ArgSpec a, double max);  // < max
ArgSpec nullable(ArgSpec a);
ArgSpec required(ArgSpec a);
// The schema's catch-all: keys it does not name are accepted as they are, for the factory to hand
// on to another registered type's schema (ZeroRedundancyOptimizer's wrapped optimizer).
ArgSpec arg_rest(const std::string& doc);
inline constexpr const char* kRestKey = "**";

// `k` checked against `schema` (unknown key with the closest known one; kind; range; choices) with
// every default the schema has filled in for the keys `k` does not set. Throws naming the key as
// Kwargs::label does.
Kwargs apply_schema(const Kwargs& k, const Schema& schema);
// One line per keyword ("lr (number >= 0, default 1): learning rate"), for help texts and docs.
std::string describe_schema(const Schema& schema);

namespace detail {
inline const Kwargs* kwargs_of(const Kwargs& k) { return &k; }
template <typename T>
const Kwargs* kwargs_of(const T&) { return nullptr; }
inline const Kwargs& checked_arg(const Kwargs&, const Kwargs& checked) { return checked; }
template <typename T>
T&& checked_arg(T&& v, const Kwargs&) { return std::forward<T>(v); }
// f with its Kwargs argument replaced by apply_schema(it, s).
template <typename R, typename... A>
std::function<R(A...)> with_schema(std::function<R(A...)> f, Schema s) {
  return [f = std::move(f), s = std::move(s)](A... a) -> R {
    const Kwargs* given = nullptr;
    ((given = given ? given : kwargs_of(a)), ...);
    const Kwargs checked = given ? apply_schema(*given, s) : Kwargs();
    return f(checked_arg(std::forward<A>(a), checked)...);
  };
}
}  // namespace detail

template <typename Factory>
class Registry {
 public:
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds `name`; throws when it is taken unless `force` (then it replaces the old one).
  void register_module(const std::string& name, Factory factory, bool force = false) {
    register_module(name, std::move(factory), Schema{}, force, /*has_schema=*/false);
  }
  // Adds `name` owning `schema`: its factory gets Kwargs checked against it, defaults filled in.
  void register_module(const std::string& name, Factory factory, Schema schema, bool force = false) {
    register_module(name, std::move(factory), std::move(schema), force, /*has_schema=*/true);
  }
  // The schema `name` was registered with; null when it has none (its factory checks its keywords).
  const Schema* schema(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = schemas_.find(name);
    return it == schemas_.end() ? nullptr : &it->second;
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
  void register_module(const std::string& name, Factory factory, Schema schema, bool force, bool has_schema) {
    std::lock_guard<std::mutex> lock(mu_);
    TANDEM_CHECK(force || factories_.count(name) == 0, kind_, ": '", name,
                 "' is already registered; pass force=true to replace it");
    schemas_.erase(name);
    if (has_schema) {
      factory = detail::with_schema(std::move(factory), schema);
      schemas_[name] = std::move(schema);
    }
    factories_[name] = std::move(factory);
  }

  std::string kind_;
  mutable std::mutex mu_;
  std::map<std::string, Factory> factories_;
  std::map<std::string, Schema> schemas_;
};

}  // namespace tandem::train
