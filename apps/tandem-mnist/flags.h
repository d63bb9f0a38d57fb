// The command-line flags that are config: one alias table of {flag, key path, value mapping} onto
// the job's MMEngine-shaped tree (--lr is optim_wrapper.optimizer.lr). It drives the parsing, the
// --help text and docs/training.md's flags table; a flag's value is checked once, by the schema of
// the key it sets, and errors name both ("--lr (optim_wrapper.optimizer.lr): must be >= 0, got -1").
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "options.h"
#include "train/run_config.h"

namespace tandem::app {

struct FlagAlias {
  std::string flag;      // "--lr"
  std::string path;      // the key path it sets ("optim_wrapper.optimizer.lr"); shown in --help
  train::ArgKind kind;   // Number, Int, String: it takes a value read as this; Bool: a switch
  std::string help;
  std::vector<std::string> words = {};  // String: the values it accepts (empty: any)
  // The keys it sets, {path: value}, from its value as read (null: {path: the value}).
  std::function<train::Json(const train::Json& value)> map = nullptr;
};

const std::vector<FlagAlias>& flag_aliases();
// Adds the table's flags to `app`; each given value lands as text in texts[flag].
void add_alias_flags(CLI::App& app, std::map<std::string, std::string>& texts);
// The settings of the flags the user gave, in table order; throws naming the flag on a value that
// is not of its kind.
std::vector<train::FlagSetting> flag_settings(const CLI::App& app, const std::map<std::string, std::string>& texts);
// The table as docs/training.md's markdown rows: | flag | key path | meaning |.
std::string flags_markdown();

// The job's config: defaults <- the config file <- --cfg-options <- the given flags, completed
// (every key checked, every default filled in), with work_dir defaulted to work_dirs/<config name>.
struct ResolvedConfig {
  train::Json tree;
  train::Origins origins;
};
ResolvedConfig resolve_config(const AppOptions& o);

}  // namespace tandem::app
