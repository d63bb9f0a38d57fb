// Multi-rank tests as real processes (after PyTorch's MultiProcessTestCase): run_ranks runs the
// current test once per rank by re-executing this test binary with --gtest_filter naming it.
// Owns: the ranks' environment (TANDEM_TEST_RANK / _WORLD / _STORE, a FileStore path, / _PARAM,
//   and OMP_NUM_THREADS=1), child_rank() which a rank uses to build its context with a Gloo group,
//   and collecting every rank's result in one place.
// Guarantees: the parent waits for all ranks within one limit (common/process.h: ranks still
//   running then are killed) and fails the test once per failed or unfinished rank, with that
//   rank's output; the ranks' scratch directory is removed.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/test_util.h"
#include "dist/store/file_store.h"
#include "dist/group/process_group_factory.h"

namespace tandem::test {

struct RankContext {
  int rank = 0, world = 1;
  std::string param;
  std::shared_ptr<dist::Store> store;
  std::shared_ptr<dist::ProcessGroup> group;
};

// In a rank: this rank's context with a Gloo group (timeout 30 s); in the parent: nullopt.
inline std::optional<RankContext> child_rank() {
  const char* rank = std::getenv("TANDEM_TEST_RANK");
  if (!rank) return std::nullopt;
  RankContext c;
  c.rank = std::atoi(rank);
  c.world = std::atoi(std::getenv("TANDEM_TEST_WORLD"));
  c.param = std::getenv("TANDEM_TEST_PARAM") ? std::getenv("TANDEM_TEST_PARAM") : "";
  c.store = std::make_shared<dist::FileStore>(std::getenv("TANDEM_TEST_STORE"), c.world, std::chrono::seconds(30));
  c.group = dist::make_process_group("gloo", c.store, c.rank, c.world, std::chrono::seconds(30));
  return c;
}

// In the parent: runs this test as `world` ranks; fails if any rank fails or they do not all
// finish within `limit`.
inline void run_ranks(int world, const std::string& param = "",
                      std::chrono::seconds limit = std::chrono::seconds(120)) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  TempDir dir("ranks");
  std::vector<Process> ranks;
  for (int r = 0; r < world; ++r) {
    const std::vector<std::string> env = {"TANDEM_TEST_RANK=" + std::to_string(r),
                                          "TANDEM_TEST_WORLD=" + std::to_string(world),
                                          "TANDEM_TEST_STORE=" + dir.file("store"), "TANDEM_TEST_PARAM=" + param,
                                          "OMP_NUM_THREADS=1"};
    ranks.emplace_back(Spawn{.argv = {self, filter}, .env = env, .out = dir / ("rank" + std::to_string(r) + ".log")});
    ASSERT_TRUE(ranks.back().started()) << "could not start rank " << r;
  }
  wait_all(ranks, limit);
  for (int r = 0; r < world; ++r) {
    const Process& p = ranks[static_cast<size_t>(r)];
    if (p.status() == 0) continue;
    ADD_FAILURE() << "rank " << r
                  << (p.timed_out() ? " did not finish in time" : " failed with status " + std::to_string(*p.status()))
                  << "; its output:\n"
                  << p.output();
  }
}

}  // namespace tandem::test
