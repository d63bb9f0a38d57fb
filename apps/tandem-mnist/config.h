// The tandem-mnist config: the JSON shape of TrainOptions (the reference
// recipe is TrainOptions' defaults, written out by configs/mnist_adadelta.json)
// and its resolution: defaults <- --config file <- --cfg-options <- given flags.
#pragma once

#include <string>

#include "options.h"
#include "train/config.h"

namespace tandem::app {

// TrainOptions' config fields as JSON (the schema: every key and its type).
train::Json options_to_json(const TrainOptions& o);
// Reads every config field from a checked JSON config; throws tandem::Error
// naming the key path on a value out of range or not among the choices.
void options_from_json(const train::Json& config, TrainOptions& o);
// The config key a command-line flag sets ("--lr" -> "optimizer.lr"), "" for flags outside the config.
std::string config_key_of_flag(const std::string& flag);
// Resolves o.config_file, o.cfg_options and o's given flags into o; returns the resolved config.
train::Json resolve_config(TrainOptions& o);

}  // namespace tandem::app
