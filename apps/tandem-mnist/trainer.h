// The training job of tandem-mnist: the resolved config tree handed to train::Runner (trainer.cpp),
// which runs the loop, evaluation, DDP, checkpoints and exact resume, and the clean stop on
// SIGTERM/SIGINT.
#pragma once

#include "flags.h"
#include "options.h"
#include "train/config.h"
#include "train/runner.h"

namespace tandem::app {

// tandem-mnist's and tandem-train's main (`name` starts error lines); tandem-test's: CONFIG
// CHECKPOINT then tandem-train's flags.
int train_main(const char* name, int argc, char** argv);
int test_main(const char* name, int argc, char** argv);

// MMEngine's TestLoop for tandem-test: the config's model with the weights of load_from (the
// checkpoint), evaluated on the val dataset with val_evaluator; rank 0 prints one line of metrics
// ("metric: value" ...). The job's files go to <work_dir>/test. Returns 0.
int run_test(const AppOptions& options, const ResolvedConfig& config);

// Runs the whole job; throws tandem::Error on bad input. Returns the exit
// code: 0 when training finished, 128 + signal after a SIGTERM/SIGINT stop
// (a resumable checkpoint saved first).
int run_training(const AppOptions& options, const ResolvedConfig& config);

}  // namespace tandem::app
