// tandem-mnist: the bundled MNIST trainer. Errors end the program with one
// line on stderr and a non-zero exit.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>

#include "core/error.h"
#include "options.h"
#include "trainer.h"

int main(int argc, char** argv) {
  tandem::app::TrainOptions options;
  if (int code = tandem::app::parse_options(argc, argv, options); code >= 0) return code;
  spdlog::set_pattern("%Y/%m/%d %H:%M:%S - %v");
  try {
    tandem::app::run_training(options);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "tandem-mnist: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-mnist: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
