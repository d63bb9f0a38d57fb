// Fuzz target: the training-config parser (train/config.h) on arbitrary bytes.
// The input is a config file, optionally followed by a line "#--" and one
// "a.b=value" override per line. It is loaded with load_config_file, merged
// onto a fixed defaults tree shaped like tandem-mnist's, then each override is
// applied. Contract checked: every step returns or throws tandem::Error
// (never nlohmann's own exceptions, a crash or a sanitizer report), and a
// merged config keeps the defaults' keys and types.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz/fuzz_file.h"
#include "train/config.h"

using tandem::train::Json;

namespace {

const Json& defaults() {
  static const Json d = Json::parse(R"({
    "data": {"dir": "datasets", "batch_size": 64, "workers": 2, "shuffle": true},
    "optim": {"name": "adadelta", "lr": 1.0, "rho": 0.9, "betas": [0.9, 0.999]},
    "train": {"epochs": 14, "seed": 1, "log_interval": 10, "amp": false},
    "dist": {"backend": "gloo", "bucket_cap_mb": 25.0, "find_unused_parameters": false}
  })");
  return d;
}

// Same keys, same JSON types (an integer may stand where the default is a float).
bool same_shape(const Json& base, const Json& got) {
  if (base.is_object()) {
    if (!got.is_object() || got.size() != base.size()) return false;
    for (auto it = base.begin(); it != base.end(); ++it)
      if (!got.contains(it.key()) || !same_shape(it.value(), got[it.key()])) return false;
    return true;
  }
  if (base.is_number_float()) return got.is_number();
  if (base.is_number_integer()) return got.is_number_integer();  // signed or unsigned
  return base.type() == got.type();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile file;
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string overrides;
  if (size_t cut = text.find("\n#--\n"); cut != std::string::npos) {
    overrides = text.substr(cut + 5);
    text.resize(cut);
  }
  const std::string& path = file.fill(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  Json config;
  try {
    Json user = tandem::train::load_config_file(path);
    config = tandem::train::merge_config(defaults(), user, path);
  } catch (const tandem::Error&) {
    config = defaults();
  }
  if (!same_shape(defaults(), config)) __builtin_trap();
  size_t start = 0;
  while (start < overrides.size()) {
    size_t end = overrides.find('\n', start);
    if (end == std::string::npos) end = overrides.size();
    try {
      tandem::train::apply_override(config, overrides.substr(start, end - start));
    } catch (const tandem::Error&) {
    }
    start = end + 1;
  }
  return 0;
}
