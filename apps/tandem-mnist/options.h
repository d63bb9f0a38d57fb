// The command line of tandem-mnist / tandem-train / tandem-test. Config settings are not held
// here: a flag of the alias table (flags.h) sets a key path of the job's MMEngine-shaped config tree
// (train/run_config.h); what stays here is what is not config: the config file, --cfg-options, the
// resume request, the outputs, and the test hooks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/run_config.h"

namespace tandem::app {

struct AppOptions {
  std::string config_file;                 // --config or the positional CONFIG
  std::vector<std::string> cfg_options;    // --cfg-options a.b=value ...
  std::vector<train::FlagSetting> flags;   // the alias-table flags the user gave, in table order
  std::string resume;                      // "": no; "auto": <work_dir>/last_checkpoint; else a path
  // Resume a checkpoint of another world size, re-sharding the rest of its epoch (train::RunnerOptions::
  // reshard_resume); always on in a group tandem-run restarted (TORCHELASTIC_RESTART_COUNT > 0).
  bool resume_reshard = false;
  int local_rank = -1;  // --local_rank/--local-rank (LOCAL_RANK wins); -1: not given
  std::string save_weights;
  std::string metrics_out;
  bool profile = false;
  bool print_config = false;  // print the completed config (JSON) and exit
  bool verbose = false;       // errors also name the source line that raised them
  int64_t debug_sigterm_at = 0;  // test hook: rank 0 raises SIGTERM after this global iteration
  int64_t debug_sigkill_at = 0;  // test hook: rank 0 raises SIGKILL after this global iteration
  int debug_sigkill_rank = 0;    // test hook: the rank --debug-sigkill-at kills
  std::string debug_samples_out;  // test hook: each rank appends "epoch iter index..." lines to this path + ".rank<r>"
  // Test hook: every rank holds after this global iteration until SIGTERM/SIGINT arrives (at most
  // 120 s), so a test's external signal lands mid-run however loaded the machine is.
  int64_t debug_hold_at = 0;
};

// Parses argv. Returns the exit code to use when the program should stop now
// (help printed, or a bad flag reported on stderr in one line), else -1.
int parse_options(int argc, char** argv, AppOptions& out);
// argv[0] without its directory ("tandem-train"), the name errors start with.
std::string program_name(const char* argv0);

}  // namespace tandem::app
