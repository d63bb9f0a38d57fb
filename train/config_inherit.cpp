// MMEngine-style config inheritance (_base_, _delete_) and schema-free path setting (see config.h).
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "train/config.h"
#include "train/py_config.h"

namespace tandem::train {
namespace {

Json load_rec(const std::filesystem::path& path, std::vector<std::string>& chain) {
  const std::string key = std::filesystem::weakly_canonical(path).string();
  for (const std::string& c : chain)
    TANDEM_CHECK(c != key, "config '", path.string(), "': _base_ inherits from itself (through ",
                 chain.back(), ")");
  Json j = load_config_file(path.string());
  TANDEM_CHECK(j.is_object(), "config '", path.string(), "' must be a JSON object");
  if (!j.contains("_base_")) return j;
  const Json bases = j["_base_"];
  j.erase("_base_");
  TANDEM_CHECK(bases.is_string() || bases.is_array(), "config '", path.string(),
               "': _base_ must be a path or a list of paths, got ", bases.dump());
  std::vector<std::string> names;
  if (bases.is_string()) names.push_back(bases.get<std::string>());
  for (const Json& b : bases.is_array() ? bases : Json::array()) {
    TANDEM_CHECK(b.is_string(), "config '", path.string(), "': _base_ entries must be paths, got ", b.dump());
    names.push_back(b.get<std::string>());
  }
  chain.push_back(key);
  Json merged = Json::object();
  for (const std::string& name : names) {
    const std::filesystem::path base = path.parent_path() / name;
    TANDEM_CHECK(std::filesystem::exists(base), "config '", path.string(), "': _base_ '", name, "' not found (",
                 base.string(), ")");
    merged = merge_inherited(merged, load_rec(base, chain));
  }
  chain.pop_back();
  return merge_inherited(merged, j);
}

}  // namespace

Json merge_inherited(const Json& base, const Json& child) {
  if (!child.is_object() || !base.is_object()) return child;
  Json out = base;
  for (const auto& [key, value] : child.items()) {
    if (value.is_object() && value.value("_delete_", false)) {
      Json v = value;
      v.erase("_delete_");
      out[key] = v;
    } else if (value.is_object() && out.contains(key) && out[key].is_object()) {
      out[key] = merge_inherited(out[key], value);
    } else {
      out[key] = value;
    }
  }
  out.erase("_delete_");
  return out;
}

Json load_config_with_bases(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".py") return load_py_config(path);
  std::vector<std::string> chain;
  return load_rec(path, chain);
}

void set_path_free(Json& config, const std::string& dotted, const Json& value) {
  TANDEM_CHECK(!dotted.empty(), "--cfg-options: empty config key");
  Json* node = &config;
  size_t start = 0;
  for (;;) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    TANDEM_CHECK(!key.empty(), "--cfg-options: bad config key '", dotted, "'");
    if (!node->is_object()) *node = Json::object();
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  *node = value;
}

}  // namespace tandem::train
