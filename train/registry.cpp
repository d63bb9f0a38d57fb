// Kwargs (see registry.h): values held as JSON text, parsed on access.
#include "train/registry.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>

#include "train/config.h"

namespace tandem::train {
namespace {

nlohmann::json parse(const Kwargs& k, const std::string& key) {
  try {
    return nlohmann::json::parse(k.items().at(key));
  } catch (const nlohmann::json::exception&) {
    return k.items().at(key);  // not JSON: the text itself, as a string
  }
}

std::string shown(const nlohmann::json& v) { return v.dump(); }

std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

const char* kind_text(ArgKind kind) {
  switch (kind) {
    case ArgKind::Number: return "a number";
    case ArgKind::Int: return "an integer";
    case ArgKind::Bool: return "true or false";
    case ArgKind::String: return "a string";
    case ArgKind::List: return "a list";
    case ArgKind::Dict: return "a dict";
    case ArgKind::Any: break;
  }
  return "any value";
}

bool kind_ok(ArgKind kind, const nlohmann::json& v) {
  switch (kind) {
    case ArgKind::Number: return v.is_number();
    case ArgKind::Int: return v.is_number_integer();
    case ArgKind::Bool: return v.is_boolean();
    case ArgKind::String: return v.is_string();
    case ArgKind::List: return v.is_array();
    case ArgKind::Dict: return v.is_object();
    case ArgKind::Any: break;
  }
  return true;
}

// The range of `a` as text: ">= 0", "> 0", "between 1 and 65535"; "" when unbounded.
std::string range_text(const ArgSpec& a) {
  const bool low = std::isfinite(a.min), high = std::isfinite(a.max);
  if (low && high && !a.min_open && !a.max_open) return "between " + number_text(a.min) + " and " + number_text(a.max);
  if (low && high)
    return std::string("in ") + (a.min_open ? "(" : "[") + number_text(a.min) + ", " + number_text(a.max) +
           (a.max_open ? ")" : "]");
  if (low) return (a.min_open ? "> " : ">= ") + number_text(a.min);
  if (high) return (a.max_open ? "< " : "<= ") + number_text(a.max);
  return "";
}

// Throws when `v` (the value of a.key in k) breaks the spec.
void check_value(const Kwargs& k, const ArgSpec& a, const nlohmann::json& v) {
  const std::string who = k.label(a.key);
  if (v.is_null() && a.nullable) return;
  const std::string range = range_text(a);
  TANDEM_CHECK(kind_ok(a.kind, v), who, " must be ", kind_text(a.kind), range.empty() ? "" : " " + range,
               a.nullable ? " (or null)" : "", ", got ", shown(v));
  if (v.is_number()) {
    const double x = v.get<double>();
    TANDEM_CHECK((a.min_open ? x > a.min : x >= a.min) && (a.max_open ? x < a.max : x <= a.max), who, " must be ",
                 range, ", got ", number_text(x));
  }
  if (v.is_string() && !a.choices.empty()) {
    std::string list;
    bool ok = false;
    for (const std::string& c : a.choices) {
      ok = ok || c == v.get<std::string>();
      list += (list.empty() ? "" : ", ") + c;
    }
    TANDEM_CHECK(ok, who, " must be one of ", list, "; got ", shown(v));
  }
}

}  // namespace

std::string Kwargs::label(const std::string& key) const {
  const std::string path = owner_.empty() ? key : owner_ + "." + key;
  auto it = origins_.find(key);
  if (it == origins_.end()) return "config key '" + path + "'";
  if (it->second.rfind("--", 0) == 0 && it->second != "--cfg-options") return it->second + " (" + path + "):";
  return it->second + ": config key '" + path + "'";
}

ArgSpec arg_of(const std::string& key, ArgKind kind, const std::string& default_json, const std::string& doc) {
  ArgSpec a;
  a.key = key;
  a.kind = kind;
  a.default_json = default_json;
  a.doc = doc;
  return a;
}
ArgSpec arg_number(const std::string& key, double def, const std::string& doc) {
  return arg_of(key, ArgKind::Number, nlohmann::json(def).dump(), doc);
}
ArgSpec arg_int(const std::string& key, int64_t def, const std::string& doc) {
  return arg_of(key, ArgKind::Int, std::to_string(def), doc);
}
ArgSpec arg_bool(const std::string& key, bool def, const std::string& doc) {
  return arg_of(key, ArgKind::Bool, def ? "true" : "false", doc);
}
ArgSpec arg_string(const std::string& key, const std::string& def, std::vector<std::string> choices,
                   const std::string& doc) {
  ArgSpec a = arg_of(key, ArgKind::String, nlohmann::json(def).dump(), doc);
  a.choices = std::move(choices);
  return a;
}
ArgSpec at_least(ArgSpec a, double min) {
  a.min = min;
  return a;
}
ArgSpec above(ArgSpec a, double min) {
  a.min = min;
  a.min_open = true;
  return a;
}
ArgSpec between(ArgSpec a, double min, double max) {
  a.min = min;
  a.max = max;
  return a;
}
ArgSpec below(ArgSpec a, double max) {
  a.max = max;
  a.max_open = true;
  return a;
}
ArgSpec nullable(ArgSpec a) {
  a.nullable = true;
  return a;
}
ArgSpec required(ArgSpec a) {
  a.required = true;
  a.default_json.clear();
  return a;
}
ArgSpec arg_rest(const std::string& doc) { return arg_of(kRestKey, ArgKind::Any, "", doc); }

Kwargs apply_schema(const Kwargs& k, const Schema& schema) {
  std::vector<std::string> names;
  bool rest = false;
  for (const ArgSpec& a : schema) {
    rest = rest || a.key == kRestKey;
    if (a.key != kRestKey) names.push_back(a.key);
  }
  if (!rest) k.check_known(names);
  Kwargs out = k;
  for (const ArgSpec& a : schema) {
    TANDEM_CHECK(!a.required || k.given(a.key), k.label(a.key), " is required (", a.doc, ")");
    if (k.has(a.key)) {
      const nlohmann::json v = parse(k, a.key);
      check_value(k, a, v);
      if (a.kind == ArgKind::Number && v.is_number_integer()) out.set(a.key, v.get<double>());  // 300 is 300.0
    } else if (!a.default_json.empty()) {
      out.set_json(a.key, a.default_json);
    }
  }
  return out;
}

std::string describe_schema(const Schema& schema) {
  std::string out;
  for (const ArgSpec& a : schema) {
    const std::string range = range_text(a);
    std::string choices;
    for (const std::string& c : a.choices) choices += (choices.empty() ? "" : "|") + c;
    out += a.key + " (" + kind_text(a.kind) + (range.empty() ? "" : " " + range) +
           (choices.empty() ? "" : ": " + choices) + (a.required ? ", required" : "") +
           (a.default_json.empty() ? "" : ", default " + a.default_json) + "): " + a.doc + "\n";
  }
  return out;
}

void Kwargs::set(const std::string& key, double v) { values_[key] = nlohmann::json(v).dump(); }
void Kwargs::set(const std::string& key, bool v) { values_[key] = v ? "true" : "false"; }
void Kwargs::set(const std::string& key, const std::string& v) { values_[key] = nlohmann::json(v).dump(); }

double Kwargs::number(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json v = parse(*this, key);
  TANDEM_CHECK(v.is_number(), owner_, ".", key, " must be a number, got ", shown(v));
  return v.get<double>();
}

int64_t Kwargs::integer(const std::string& key, int64_t fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json v = parse(*this, key);
  TANDEM_CHECK(v.is_number_integer(), owner_, ".", key, " must be an integer, got ", shown(v));
  return v.get<int64_t>();
}

bool Kwargs::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json v = parse(*this, key);
  TANDEM_CHECK(v.is_boolean(), owner_, ".", key, " must be true or false, got ", shown(v));
  return v.get<bool>();
}

std::string Kwargs::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json v = parse(*this, key);
  TANDEM_CHECK(v.is_string(), owner_, ".", key, " must be a string, got ", shown(v));
  return v.get<std::string>();
}

void Kwargs::check_set(const std::string& key) const {
  TANDEM_CHECK(has(key), owner_, ".", key, " is not set (a registered type's schema fills it in; build it through "
               "its registry or give it)");
}
double Kwargs::number(const std::string& key) const { return check_set(key), number(key, 0.0); }
int64_t Kwargs::integer(const std::string& key) const { return check_set(key), integer(key, int64_t{0}); }
bool Kwargs::boolean(const std::string& key) const { return check_set(key), boolean(key, false); }
std::string Kwargs::string(const std::string& key) const { return check_set(key), string(key, std::string()); }

void Kwargs::check_known(const std::vector<std::string>& known) const {
  for (const auto& [key, value] : values_) {
    bool ok = false;
    for (const std::string& k : known) ok = ok || k == key;
    if (ok) continue;
    std::string list;
    for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
    const std::string guess = closest_key(key, known);
    TANDEM_FAIL(owner_, ": unknown argument '", key, "'", guess.empty() ? "" : " (did you mean '" + guess + "'?)",
                "; expected one of: ", list.empty() ? "(none)" : list);
  }
}

}  // namespace tandem::train
