// Kwargs (see registry.h): values held as JSON text, parsed on access.
#include "train/registry.h"

#include <nlohmann/json.hpp>

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

}  // namespace

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
