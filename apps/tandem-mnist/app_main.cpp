// The trainer's main (tandem-mnist and tandem-train, see trainer.h). Errors end the program with
// one line on stderr and a non-zero exit: 2 for a bad flag or config, 1 for a failure while
// running, 128 + signal after a SIGTERM/SIGINT stop.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "flags.h"
#include "core/error.h"
#include "options.h"
#include "train/stop_signal.h"
#include "trainer.h"

namespace tandem::app {
namespace {

// One line on stderr: the program, the message, and with --verbose the check that raised it.
void print_error(const char* name, const Error& e, bool verbose) {
  const bool tag = verbose && !e.where().empty();
  std::fprintf(stderr, "%s: error: %s%s%s%s\n", name, e.what(), tag ? " [" : "", tag ? e.where().c_str() : "",
               tag ? "]" : "");
}

// Runs `job`; an error ends it with one line on stderr and exit code `code`.
template <typename F>
int guarded(const char* name, bool verbose, int code, F&& job) {
  try {
    return job();
  } catch (const Error& e) {
    print_error(name, e, verbose);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected error: %s\n", name, e.what());
  }
  return code;
}

}  // namespace

int train_main(const char* name, int argc, char** argv) {
  AppOptions options;
  if (int code = parse_options(argc, argv, options); code >= 0) return code;
  // --local_rank=N, as MMEngine's tools/train.py: the environment's LOCAL_RANK wins when both are set.
  if (options.local_rank >= 0) ::setenv("LOCAL_RANK", std::to_string(options.local_rank).c_str(), /*overwrite=*/0);
  spdlog::set_pattern("%Y/%m/%d %H:%M:%S - %v");
  ResolvedConfig config;
  if (int code = guarded(name, options.verbose, 2, [&] { return config = resolve_config(options), 0; }); code != 0)
    return code;
  if (options.print_config) {
    std::printf("%s\n", config.tree.dump(2).c_str());
    return 0;
  }
  return guarded(name, options.verbose, 1, [&] {
    train::StopSignal::install();
    return run_training(options, config);
  });
}

int test_main(const char* name, int argc, char** argv) {
  if (argc < 3 || argv[1][0] == '-' || argv[2][0] == '-') {
    std::fprintf(stderr, "usage: %s CONFIG CHECKPOINT [--work-dir DIR] [--cfg-options KEY=VALUE ...] "
                 "[--launcher none|pytorch|slurm|mpi] [other tandem-train flags]\n", name);
    return 2;
  }
  // tandem-train's command line with the checkpoint as the initial weights (load_from).
  std::vector<std::string> args = {name, argv[1], "--init-weights", argv[2]};
  for (int i = 3; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> argp;
  for (std::string& a : args) argp.push_back(a.data());
  AppOptions options;
  if (int code = parse_options(static_cast<int>(argp.size()), argp.data(), options); code >= 0) return code;
  if (options.local_rank >= 0) ::setenv("LOCAL_RANK", std::to_string(options.local_rank).c_str(), /*overwrite=*/0);
  spdlog::set_pattern("%Y/%m/%d %H:%M:%S - %v");
  ResolvedConfig config;
  if (int code = guarded(name, options.verbose, 2, [&] { return config = resolve_config(options), 0; }); code != 0)
    return code;
  return guarded(name, options.verbose, 1, [&] { return run_test(options, config); });
}

}  // namespace tandem::app
