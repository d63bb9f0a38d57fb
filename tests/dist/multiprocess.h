// Test helper: runs the current test in N fresh processes, one per rank, by
// re-executing this test binary with --gtest_filter naming the test. Children
// see TANDEM_TEST_RANK / _WORLD / _STORE (a FileStore path) / _PARAM and build
// their own process group; the parent waits for all of them (bounded) and
// fails the test with their output when any child fails or hangs.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/file_store.h"
#include "dist/process_group_factory.h"

extern char** environ;

namespace tandem::test {

struct RankContext {
  int rank = 0, world = 1;
  std::string param;
  std::shared_ptr<dist::Store> store;
  std::shared_ptr<dist::ProcessGroup> group;
};

// In a child: this rank's context with a Gloo group (timeout 30 s); else nullopt.
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

// In the parent: runs this test as `world` ranks; fails if any rank fails or
// they do not all finish within `limit`.
inline void run_ranks(int world, const std::string& param = "",
                      std::chrono::seconds limit = std::chrono::seconds(120)) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tandem-ranks-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  const std::string store = (dir / "store").string();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    env_strings.push_back("TANDEM_TEST_RANK=" + std::to_string(r));
    env_strings.push_back("TANDEM_TEST_WORLD=" + std::to_string(world));
    env_strings.push_back("TANDEM_TEST_STORE=" + store);
    env_strings.push_back("TANDEM_TEST_PARAM=" + param);
    env_strings.push_back("OMP_NUM_THREADS=1");
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string log = (dir / ("rank" + std::to_string(r) + ".log")).string();
    std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    std::vector<char*> argv = {self.data(), const_cast<char*>(filter.c_str()), nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, self.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ASSERT_EQ(rc, 0) << "could not start rank " << r;
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<int> status(world, -1);
  int remaining = world;
  while (remaining > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < world; ++r) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --remaining;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r)
    if (status[r] == -1) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
    }
  for (int r = 0; r < world; ++r) {
    if (status[r] == 0) continue;
    std::ifstream in(dir / ("rank" + std::to_string(r) + ".log"));
    std::stringstream ss;
    ss << in.rdbuf();
    ADD_FAILURE() << "rank " << r << (status[r] == -1 ? " did not finish in time" : " failed with status " +
                                                           std::to_string(status[r]))
                  << "; its output:\n"
                  << ss.str();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace tandem::test
