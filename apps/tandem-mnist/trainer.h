// The training job of tandem-mnist: data, model, optimizer, the loop with
// progress lines, evaluation, metrics, the work dir, checkpoints and exact
// resume, and a clean stop on SIGTERM/SIGINT.
#pragma once

#include "options.h"
#include "train/config.h"

namespace tandem::app {

// Runs the whole job; throws tandem::Error on bad input. Returns the exit
// code: 0 when training finished, 128 + signal after a SIGTERM/SIGINT stop
// (a resumable checkpoint saved first).
int run_training(const TrainOptions& options, const train::Json& config);

}  // namespace tandem::app
