// The work dir of a training run: work_dirs/<config name>/ by default, holding
// <timestamp>.log, <timestamp>.metrics.jsonl, config.json, checkpoints and
// last_checkpoint. Only rank 0 creates and writes it.
#pragma once

#include <string>

namespace tandem::train {

// work_dirs/<config file stem>, or work_dirs/<fallback> without a config file.
std::string default_work_dir(const std::string& config_file, const std::string& fallback = "mnist");
// Creates the directory (and parents); throws tandem::Error naming it when it cannot.
void create_work_dir(const std::string& dir);
// Local time as YYYYmmdd_HHMMSS, for this run's log file names.
std::string run_timestamp();

}  // namespace tandem::train
