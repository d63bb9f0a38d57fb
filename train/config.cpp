// Config merging and overrides (see config.h).
#include "train/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/py_config.h"

namespace tandem::train {
namespace {

std::string type_name(const Json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  return "null";
}

std::string join(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

std::vector<std::string> keys_of(const Json& obj) {
  std::vector<std::string> out;
  for (auto it = obj.begin(); it != obj.end(); ++it) out.push_back(it.key());
  return out;
}

[[noreturn]] void unknown_key(const std::string& source, const std::string& parent_path, const std::string& key,
                              const Json& parent) {
  const std::string guess = closest_key(key, keys_of(parent));
  std::string known;
  for (const auto& k : keys_of(parent)) known += (known.empty() ? "" : ", ") + k;
  TANDEM_FAIL(source, ": unknown config key '", join(parent_path, key), "'",
              guess.empty() ? "" : " (did you mean '" + join(parent_path, guess) + "'?)", "; known keys",
              parent_path.empty() ? "" : " in '" + parent_path + "'", ": ", known);
}

// A value as it appears in an error message: invalid UTF-8 replaced, at most 80 characters.
std::string brief(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// `value` converted to the schema's type, or an error naming the path.
Json checked(const Json& schema, const Json& value, const std::string& path, const std::string& source) {
  if (schema.is_object()) {
    TANDEM_CHECK(value.is_object(), source, ": config key '", path, "' must be an object, got ", type_name(value),
                 " ", brief(value));
    Json out = schema;
    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string sub = join(path, it.key());
      if (!schema.contains(it.key())) unknown_key(source, path, it.key(), schema);
      out[it.key()] = checked(schema[it.key()], it.value(), sub, source);
    }
    return out;
  }
  const bool ok = (schema.is_boolean() && value.is_boolean()) ||
                  (schema.is_number_integer() && value.is_number_integer()) ||
                  (schema.is_number_float() && value.is_number()) || (schema.is_string() && value.is_string()) ||
                  (schema.is_array() && value.is_array()) || schema.is_null();
  TANDEM_CHECK(ok, source, ": config key '", path, "' must be ",
               schema.is_number_float() ? "a number" : "of type " + type_name(schema), ", got ", type_name(value),
               " ", brief(value));
  if (schema.is_number_float()) return Json(value.get<double>());
  return value;
}

}  // namespace

std::string closest_key(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
  for (const auto& c : candidates) {
    std::vector<size_t> row(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= key.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= c.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (key[i - 1] == c[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    if (row[c.size()] < best_d) {
      best_d = row[c.size()];
      best = c;
    }
  }
  return best;
}

Json load_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) {
    std::error_code ec;
    const bool exists = std::filesystem::exists(path, ec);
    TANDEM_FAIL("cannot read config file '", path, "': ",
                exists ? "it exists but cannot be opened (check its permissions)"
                       : "no such file (configs/ holds the bundled ones, e.g. configs/mnist/mnist_net_adadelta.json)");
  }
  try {
    return Json::parse(in, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const Json::exception& e) {  // parse errors, and numbers out of range
    // nlohmann's text without its "[json.exception.parse_error.101] " tag.
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos)
      what = what.substr(what.find("] ") + 2);
    TANDEM_FAIL("config file '", path, "' is not valid JSON: ", what);
  }
}

Json merge_config(const Json& base, const Json& user, const std::string& source) {
  TANDEM_CHECK(user.is_object(), source, ": a config must be a JSON object, got ", type_name(user));
  return checked(base, user, "", source);
}

const Json& get_path(const Json& config, const std::string& dotted) {
  const Json* node = &config;
  size_t start = 0;
  for (;;) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    TANDEM_CHECK(node->is_object() && node->contains(key), "config has no key '", dotted, "'");
    node = &(*node)[key];
    if (dot == std::string::npos) return *node;
    start = dot + 1;
  }
}

void set_path(Json& config, const std::string& dotted, const Json& value, const std::string& source) {
  TANDEM_CHECK(!dotted.empty(), source, ": empty config key");
  Json* node = &config;
  size_t start = 0;
  for (;;) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const std::string parent = start == 0 ? "" : dotted.substr(0, start - 1);
    TANDEM_CHECK(node->is_object(), source, ": config key '", parent, "' is not an object, so '", dotted,
                 "' does not exist");
    if (!node->contains(key)) unknown_key(source, parent, key, *node);
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  *node = checked(*node, value, dotted, source);
}

void apply_override(Json& config, const std::string& assignment, const std::string& source) {
  const size_t eq = assignment.find('=');
  TANDEM_CHECK(eq != std::string::npos && eq > 0, source, ": expected KEY=VALUE (e.g. optim_wrapper.optimizer.lr=0.5), got '",
               assignment, "'");
  const std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {  // not JSON: read as MMEngine's DictAction reads it, else the text
    try {
      value = parse_cfg_option_value(text);
    } catch (const Error&) {
      value = text;
    }
  }
  // A string key takes the text as written ("work_dir=123" is the string "123").
  const Json* current = nullptr;
  try {
    current = &get_path(config, key);
  } catch (const Error&) {
    current = nullptr;  // set_path reports the unknown key with a suggestion
  }
  if (current && current->is_string() && !value.is_string()) value = text;
  set_path(config, key, value, source);
}

std::string config_name(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace tandem::train
