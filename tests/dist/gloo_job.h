// The multi-process harness of the process-group tests: each job forks one child per rank
// (common/process.h's fork_children); the children meet through a FileStore in a fresh temporary
// directory and talk over Gloo's TCP transport on loopback (MASTER_ADDR=127.0.0.1), or through
// shared memory when every rank is on this host and TANDEM_SHM is not 0. A child reports through a
// file (the failure text, or nothing) and its exit status; the parent kills every child still
// running after the job's deadline, so no test can hang. The parent never creates a process group
// itself (no threads before fork).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/test_util.h"
#include "core/error.h"
#include "dist/group/process_group_gloo.h"
#include "dist/store/file_store.h"

namespace tandem::dist {
namespace {

using namespace std::chrono_literals;

constexpr int kSkipCode = 77;  // a child that exits with this skipped its test (message says why)

struct RankResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string message;
};

struct JobOptions {
  Millis timeout = 30s;                  // group and store timeout
  std::chrono::seconds deadline = 120s;  // children still running then are killed
  std::map<std::string, std::string> env = {{"MASTER_ADDR", "127.0.0.1"}};
};

// Runs body(rank, store_path) in `size` forked children (common/process.h) and returns their
// outcomes; a child's report is the message of the exception that ended its body, in a file.
std::vector<RankResult> run_children(int size, const std::function<void(int, const std::string&)>& body,
                                     const JobOptions& opt) {
  test::TempDir dir("pg");
  const std::string store_path = dir.file("store");
  auto report = [&](int r) { return dir / ("rank" + std::to_string(r) + ".report"); };
  std::vector<test::Process> children = test::fork_children(size, [&](int r) {
    for (const auto& [k, v] : opt.env) setenv(k.c_str(), v.c_str(), 1);
    std::string message;
    int code = 0;
    try {
      body(r, store_path);
    } catch (const std::exception& e) {
      message = e.what();
      code = message.rfind("SKIP:", 0) == 0 ? kSkipCode : 1;
    } catch (...) {
      message = "unknown exception";
      code = 1;
    }
    std::ofstream(report(r), std::ios::binary) << message;
    return code;
  });
  test::wait_all(children, opt.deadline);
  std::vector<RankResult> results(size);
  for (int r = 0; r < size; ++r) {
    results[r].exit_code = children[r].status().value_or(-1);
    results[r].message = test::read_file(report(r));
    if (children[r].timed_out() && results[r].message.empty())
      results[r].message =
          "still running after the test's deadline of " + std::to_string(opt.deadline.count()) + " s";
  }
  return results;
}

using GroupBody = std::function<void(ProcessGroupGloo& pg, Store& store)>;

// Each child builds a FileStore and a ProcessGroupGloo, then runs body.
std::vector<RankResult> run_job(int size, const GroupBody& body, const JobOptions& opt = {}) {
  return run_children(
      size,
      [&](int rank, const std::string& path) {
        auto store = std::make_shared<FileStore>(path, size, opt.timeout);
        ProcessGroupGloo pg(store, rank, size, opt.timeout);
        body(pg, *store);
      },
      opt);
}

// Every rank exited 0 with no message; skipped when every rank skipped.
void expect_all_ok(const std::vector<RankResult>& results) {
  int skipped = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].exit_code == kSkipCode) {
      ++skipped;
      continue;
    }
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].message;
    EXPECT_EQ(results[r].message, "") << "rank " << r;
  }
  if (skipped == static_cast<int>(results.size()) && skipped > 0) GTEST_SKIP() << results[0].message;
}

// Throws std::runtime_error (reported by the harness) when cond is false.
#define CHILD_CHECK(cond, ...)                                                                    \
  do {                                                                                            \
    if (!(cond))                                                                                  \
      throw std::runtime_error(                                                                   \
          ::tandem::detail::str_cat("line ", __LINE__, ": ", #cond, " is false. ", __VA_ARGS__)); \
  } while (0)

// The tandem::Error message of fn(), or a failure when it does not throw one.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  throw std::runtime_error("expected a tandem::Error, none was thrown");
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace
}  // namespace tandem::dist
