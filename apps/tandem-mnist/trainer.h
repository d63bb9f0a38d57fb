// The training job of tandem-mnist: the MNIST data sets and the resolved options handed to
// train::Runner (trainer.cpp), which runs the loop, evaluation, DDP, checkpoints and exact resume,
// and the clean stop on SIGTERM/SIGINT.
#pragma once

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
int run_test(const TrainOptions& options, const train::Json& config);

// Runs the whole job; throws tandem::Error on bad input. Returns the exit
// code: 0 when training finished, 128 + signal after a SIGTERM/SIGINT stop
// (a resumable checkpoint saved first).
int run_training(const TrainOptions& options, const train::Json& config);
// The train and val datasets of the options: the IDX files of data_dir (limit, test_limit), or the
// registered dataset the config names (train_dataloader.dataset.type, train/models/zoo.h).
void set_datasets(const TrainOptions& options, train::RunnerOptions& r);

}  // namespace tandem::app
