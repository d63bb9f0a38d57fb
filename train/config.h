// Training configs as JSON (nlohmann-json): a schema of defaults, a user file
// merged onto it, then "a.b=value" overrides. Owns only the generic rules; an
// application supplies its own defaults tree (apps/tandem-mnist/config.cpp).
//
// Rules: every key the user gives must exist in the defaults (an unknown key is
// an error naming its full path, with "did you mean" a close sibling); its
// value must have the default's type (objects recurse; an integer is accepted
// where a float is expected, never the reverse; a string key takes any
// override text). Errors are tandem::Error naming the source (file or
// --cfg-options), the dotted key path and the expected type.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::train {

using Json = nlohmann::json;

// Parses a JSON config file (throws naming the file, line and column on bad JSON).
Json load_config_file(const std::string& path);

// load_config_file with MMEngine's inheritance: "_base_" (a path or a list of paths, relative to
// the file) names configs loaded first (recursively, in order; a cycle is an error naming it); the
// file's keys are then merged onto them, objects recursively, except that an object holding
// "_delete_": true replaces the base's value whole. The result has no "_base_" or "_delete_" key.
// A path ending in .py is read by load_py_config (train/py_config.h).
Json load_config_with_bases(const std::string& path);
// The merge rule above, without schema checks.
Json merge_inherited(const Json& base, const Json& child);
// Sets the value at a dotted path, creating objects on the way (no schema: MMEngine-shaped trees).
void set_path_free(Json& config, const std::string& dotted, const Json& value);

// `base` with every key of `user` replacing the default (recursively), checked
// against `base` as the schema. `source` names where `user` came from.
Json merge_config(const Json& base, const Json& user, const std::string& source);

// Applies one "a.b.c=value" override: value parsed as JSON if it is JSON, else as MMEngine's
// --cfg-options value (parse_cfg_option_value: True, (0.9,0.999), a,b ...), else taken as a string;
// a string key takes the text as written; checked against the current value's type.
void apply_override(Json& config, const std::string& assignment, const std::string& source = "--cfg-options");

// Sets the value at a dotted path that must already exist (type-checked).
void set_path(Json& config, const std::string& dotted, const Json& value, const std::string& source);
// The value at a dotted path (throws naming the path if absent).
const Json& get_path(const Json& config, const std::string& dotted);

// A name for the config: the file's stem ("configs/mnist_sgd.json" -> "mnist_sgd").
std::string config_name(const std::string& path);

// The key of `candidates` closest to `key` by edit distance, if close enough; else "".
std::string closest_key(const std::string& key, const std::vector<std::string>& candidates);

}  // namespace tandem::train
