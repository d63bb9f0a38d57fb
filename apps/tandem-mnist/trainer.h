// The training job of tandem-mnist: data, model, optimizer, the loop with
// progress lines, evaluation after every epoch, metrics and weights files.
#pragma once

#include "options.h"

namespace tandem::app {

// Runs the whole job; throws tandem::Error on bad input.
void run_training(const TrainOptions& options);

}  // namespace tandem::app
