// The Runner's built-in hooks, one concern per file (train/hooks/*.cpp), each a factory from its
// config entry's keyword arguments, registered in train::hooks() by their MMEngine names.
//   IterTimerHook          data_time and time of every iteration                        NORMAL
//   LoggerHook             the progress line every `interval` iterations, the epoch and
//                          validation lines, the metrics JSON lines                     BELOW_NORMAL
//   ParamSchedulerHook     steps the scheduler after each iteration or epoch            LOW
//   DistSamplerSeedHook    sets the sampler's epoch before each epoch (the shuffle)     NORMAL
//   StopAgreementHook      every rank agrees on a SIGTERM/SIGINT stop each iteration    LOW + 5
//   CheckpointHook         interval (epochs, or iterations with by_epoch false),
//                          max_keep_ckpts, save_best (accuracy | loss), and a save
//                          whenever a stop was agreed                                  VERY_LOW
//   CheckInvalidLossHook   a NaN or infinite loss ends the run naming the iteration     VERY_HIGH
// and the custom hooks:
//   EMAHook                an exponential moving average of the weights, validated with
//                          and saved in checkpoints (ema_state_dict)                    NORMAL
//   EarlyStoppingHook      ends the run when a validation metric stops improving        LOWEST
#pragma once

#include <memory>

#include "train/hook.h"
#include "train/registry.h"

namespace tandem::train {

std::shared_ptr<Hook> make_iter_timer_hook(const Kwargs& k);
std::shared_ptr<Hook> make_logger_hook(const Kwargs& k);
std::shared_ptr<Hook> make_param_scheduler_hook(const Kwargs& k);
std::shared_ptr<Hook> make_dist_sampler_seed_hook(const Kwargs& k);
std::shared_ptr<Hook> make_stop_agreement_hook(const Kwargs& k);
std::shared_ptr<Hook> make_checkpoint_hook(const Kwargs& k);
std::shared_ptr<Hook> make_check_invalid_loss_hook(const Kwargs& k);
std::shared_ptr<Hook> make_ema_hook(const Kwargs& k);
std::shared_ptr<Hook> make_early_stopping_hook(const Kwargs& k);

// The keyword schemas of the hooks that take keywords (the others own an empty one); each factory
// above is given its keywords checked against its schema, defaults filled in.
Schema logger_hook_schema();
Schema checkpoint_hook_schema();
Schema ema_hook_schema();
Schema early_stopping_hook_schema();

}  // namespace tandem::train
