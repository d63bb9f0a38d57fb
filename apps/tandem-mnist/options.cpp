// Command-line parsing of tandem-mnist (CLI11): the alias table's flags (flags.h), which become
// settings of config keys, and the flags that are not config.
#include "options.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli_checks.h"
#include "flags.h"
#include "train/config.h"

namespace tandem::app {

namespace {

// Hidden flags the fault tests drive the trainer with.
void add_test_hooks(CLI::App& app, AppOptions& o) {
  app.add_option("--debug-sigterm-at", o.debug_sigterm_at, "")->group("");
  app.add_option("--debug-sigkill-at", o.debug_sigkill_at, "")->group("");
  app.add_option("--debug-sigkill-rank", o.debug_sigkill_rank, "")->group("");
  app.add_option("--debug-samples-out", o.debug_samples_out, "")->group("");
  app.add_option("--debug-hold-at", o.debug_hold_at, "")->group("");
}

// The first argument no option took: an unknown flag with the closest known one, or a stray word.
std::string unexpected_argument(const CLI::App& app) {
  const std::vector<std::string> rest = app.remaining();
  if (rest.empty()) return "";
  const std::string& arg = rest.front();
  if (arg.rfind("-", 0) != 0 || arg == "-")
    return "unexpected argument '" + arg + "' (the config is the only positional argument)";
  const std::string flag = arg.substr(0, arg.find('='));
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options())
    if (!opt->get_group().empty())
      for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
  const std::string guess = train::closest_key(flag, names);
  return "unknown flag " + flag + (guess.empty() ? "" : " (did you mean " + guess + "?)");
}

}  // namespace

std::string program_name(const char* argv0) {
  const std::string path = argv0 ? argv0 : "tandem-train";
  return path.substr(path.find_last_of('/') + 1);
}

int parse_options(int argc, char** argv, AppOptions& o) {
  CLI::App app{"tandem-train (tandem-mnist): train a registered model from a config (default: the MNIST convnet, "
               "conv-bn-relu-pool x2, fc-relu-fc, log-softmax, NLL). A flag sets the config key in brackets."};
  // A flag given twice takes its last value (a wrapper script's defaults can be overridden).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::map<std::string, std::string> texts;
  add_alias_flags(app, texts);
  app.add_option("--save-weights", o.save_weights, "write the trained weights here (safetensors)");
  app.add_option("--metrics-out", o.metrics_out, "write JSON lines: one per iteration and per evaluation");
  app.add_option("--config", o.config_file,
                 "JSON or .py config (see configs/); its keys override the defaults, flags override it");
  std::string positional_config;
  app.add_option("CONFIG", positional_config,
                 "the config, as MMEngine's tools/train.py CONFIG (the same as --config)");
  app.add_option("--local_rank,--local-rank", o.local_rank,
                 "this process's local rank, as torch.distributed.launch passes it (LOCAL_RANK wins when set)")
      ->check(at_least(0));
  app.add_option("--cfg-options", o.cfg_options,
                 "override config keys: KEY=VALUE ... (e.g. optim_wrapper.optimizer.lr=0.5)")
      ->expected(1, -1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--resume", o.resume,
                 "continue a run exactly: with no value from the work dir's last_checkpoint, or from this checkpoint")
      ->expected(0, 1);
  app.add_flag("--resume-reshard", o.resume_reshard,
               "resume a checkpoint written by another number of ranks: the samples its epoch consumed stay "
               "consumed, the rest of the epoch is sharded over this run's ranks (not bitwise an uninterrupted run; "
               "automatic in a group tandem-run restarted)");
  app.add_flag("--print-config", o.print_config, "print the completed config (JSON, MMEngine's keys) and exit");
  app.add_flag("--verbose", o.verbose, "errors also name the source line that raised them");
  app.add_flag("--profile", o.profile, "time every op and print a table at the end, training and evaluation apart");
  add_test_hooks(app, o);
  bool flags_markdown_out = false;  // docs/training.md's flags table, from the alias table
  app.add_flag("--flags-markdown", flags_markdown_out, "")->group("");
  app.allow_extras();  // reported below, with the closest flag
  const std::string name = program_name(argv[0]);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", name.c_str(), e.what());
    return 2;
  }
  if (const std::string extra = unexpected_argument(app); !extra.empty()) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", name.c_str(), extra.c_str());
    return 2;
  }
  if (flags_markdown_out) {
    std::printf("%s", flags_markdown().c_str());
    return 0;
  }
  if (!positional_config.empty()) {
    if (!o.config_file.empty() && o.config_file != positional_config) {
      std::fprintf(stderr, "%s: error: two configs given ('%s' and --config '%s'); give one\n", name.c_str(),
                   positional_config.c_str(), o.config_file.c_str());
      return 2;
    }
    o.config_file = positional_config;
  }
  try {
    o.flags = flag_settings(app, texts);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    return 2;
  }
  if (app.count("--resume") > 0 && o.resume.empty()) o.resume = "auto";
  return -1;
}

}  // namespace tandem::app
