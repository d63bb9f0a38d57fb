// The multi-process side of the memory benchmarks (zero_memory, fsdp_memory): each configuration
// runs as `world` fresh processes of the benchmark itself, so each rank's peak RSS belongs to that
// configuration alone. A rank writes its numbers as one JSON object to the file its --out names.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <spawn.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

extern char** environ;

namespace bench {

// --json FILE and --overwrite, as every benchmark's output rule: an existing result file is replaced only
// when asked, so a run does not silently change the committed bench/results/ files. Call
// refuse_to_write_over after parsing.
inline void add_json_output(CLI::App& app, std::string& path, bool& overwrite) {
  app.add_option("--json", path, "write every rank's numbers here (an existing file only with --overwrite)");
  app.add_flag("--overwrite", overwrite, "let --json replace an existing file");
}

// Exits with status 2 and one line when `path` exists and `overwrite` is false.
inline void refuse_to_write_over(const std::string& tool, const std::string& path, bool overwrite) {
  if (path.empty() || overwrite || !std::filesystem::exists(path)) return;
  std::cerr << tool << ": " << path << " exists: pass --overwrite to replace it, or name another --json file\n";
  std::exit(2);
}

// This process's peak resident set (VmHWM), in bytes; -1 when /proc does not say.
inline int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// Starts `world` processes of this program with `args` plus --rank R --world W --store S --out O
// (S and O under `scratch`, named by `tag`), waits for all of them, and returns each rank's JSON.
// Throws naming `tool` and `tag` when a rank cannot start or fails (its own error is on stderr).
inline std::vector<nlohmann::json> run_rank_processes(const std::string& tool, const std::string& tag, int world,
                                                      const std::vector<std::string>& args,
                                                      const std::filesystem::path& scratch) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  auto out_file = [&](int r) { return scratch / (tag + "." + std::to_string(r) + ".json"); };
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> all = {self};
    all.insert(all.end(), args.begin(), args.end());
    for (const std::string& a : {std::string("--rank"), std::to_string(r), std::string("--world"), std::to_string(world),
                                 std::string("--store"), (scratch / (tag + ".store")).string(), std::string("--out"),
                                 out_file(r).string()})
      all.push_back(a);
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    TANDEM_CHECK(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) == 0, tool,
                 ": could not start rank ", r, " of ", tag);
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  TANDEM_CHECK(ok, tool, ": a rank of ", tag, " failed (its error is above)");
  std::vector<nlohmann::json> out;
  for (int r = 0; r < world; ++r) out.push_back(nlohmann::json::parse(std::ifstream(out_file(r))));
  return out;
}

// The options run_rank_processes passes to each rank, for the benchmark's own CLI.
inline void add_rank_options(CLI::App& app, int& rank, int& world, std::string& store, std::string& out) {
  app.add_option("--rank", rank, "(internal) run as this rank");
  app.add_option("--world", world, "(internal)");
  app.add_option("--store", store, "(internal)");
  app.add_option("--out", out, "(internal)");
}

// main's body after parsing: one rank (rank >= 0) or the driver; an error becomes one line and exit 1.
inline int run_rank_or_drive(const std::string& tool, int rank, const std::function<void()>& run_rank,
                             const std::function<int()>& drive) {
  try {
    if (rank >= 0) {
      run_rank();
      return 0;
    }
    return drive();
  } catch (const std::exception& e) {
    std::cerr << tool << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace bench
