// tandem-mnist: the bundled MNIST trainer. Errors end the program with one
// line on stderr and a non-zero exit: 2 for a bad flag or config, 1 for a
// failure while running, 128 + signal after a SIGTERM/SIGINT stop.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "config.h"
#include "core/error.h"
#include "options.h"
#include "train/stop_signal.h"
#include "trainer.h"

int main(int argc, char** argv) {
  tandem::app::TrainOptions options;
  if (int code = tandem::app::parse_options(argc, argv, options); code >= 0) return code;
  // --local_rank=N, as MMEngine's tools/train.py: the environment's LOCAL_RANK wins when both are set.
  if (options.local_rank >= 0) ::setenv("LOCAL_RANK", std::to_string(options.local_rank).c_str(), /*overwrite=*/0);
  spdlog::set_pattern("%Y/%m/%d %H:%M:%S - %v");
  tandem::train::Json config;
  try {
    config = tandem::app::resolve_config(options);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem-mnist: error: %s\n", e.what());
    return 2;
  }
  if (options.print_config) {
    std::printf("%s\n", config.dump(2).c_str());
    return 0;
  }
  try {
    tandem::train::StopSignal::install();
    return tandem::app::run_training(options, config);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem-mnist: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-mnist: unexpected error: %s\n", e.what());
    return 1;
  }
}
