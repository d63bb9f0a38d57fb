// The training job of tandem-mnist: the MNIST data sets and the resolved options handed to
// train::Runner (trainer.cpp), which runs the loop, evaluation, DDP, checkpoints and exact resume,
// and the clean stop on SIGTERM/SIGINT.
#pragma once

#include "options.h"
#include "train/config.h"

namespace tandem::app {

// Runs the whole job; throws tandem::Error on bad input. Returns the exit
// code: 0 when training finished, 128 + signal after a SIGTERM/SIGINT stop
// (a resumable checkpoint saved first).
int run_training(const TrainOptions& options, const train::Json& config);

}  // namespace tandem::app
