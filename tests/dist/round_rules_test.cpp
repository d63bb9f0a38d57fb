// tandem-run's rendezvous decisions (apps/tandem-run/round_rules.h): when a round closes, and the
// node ranks of the agents that made it.
#include "round_rules.h"

#include <gtest/gtest.h>

using namespace tandem::run;

TEST(RoundRules, ARoundClosesAtMaxOrAfterTheLastCallOnceMinJoined) {
  const RoundLimits l{2, 4, 2.0, 10.0};
  EXPECT_EQ(round_state(l, 1, 5.0, std::nullopt), RoundState::kOpen);
  EXPECT_EQ(round_state(l, 2, 5.0, 1.9), RoundState::kOpen);       // MIN, last call still running
  EXPECT_EQ(round_state(l, 3, 5.0, 2.0), RoundState::kClose);      // last call over
  EXPECT_EQ(round_state(l, 4, 0.1, 0.0), RoundState::kClose);      // MAX: at once
  EXPECT_EQ(round_state(l, 1, 10.0, std::nullopt), RoundState::kTimedOut);
  EXPECT_EQ(round_state(l, 0, 10.0, std::nullopt), RoundState::kTimedOut);
  EXPECT_EQ(round_state(l, 2, 12.0, 0.5), RoundState::kOpen);      // MIN reached: the join timeout is over
  EXPECT_EQ(round_state({1, 1, 2.0, 10.0}, 1, 0.0, 0.0), RoundState::kClose);
}

TEST(RoundRules, TheStoreHostIsNodeZeroAndTheOthersFollowByArrival) {
  std::vector<int> ranks;
  EXPECT_EQ(assign_node_ranks({{-1, false}, {-1, true}, {-1, false}}, ranks), "");
  EXPECT_EQ(ranks, (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(assign_node_ranks({{-1, true}}, ranks), "");
  EXPECT_EQ(ranks, (std::vector<int>{0}));
  EXPECT_NE(assign_node_ranks({{-1, false}, {-1, false}}, ranks).find("serves the rendezvous store"),
            std::string::npos);
}

TEST(RoundRules, GivenNodeRanksAreKeptAndCheckedForClashes) {
  std::vector<int> ranks;
  EXPECT_EQ(assign_node_ranks({{1, false}, {0, true}, {2, false}}, ranks), "");
  EXPECT_EQ(ranks, (std::vector<int>{1, 0, 2}));
  EXPECT_NE(assign_node_ranks({{1, false}, {1, true}}, ranks).find("two agents gave --node-rank 1"), std::string::npos);
  EXPECT_NE(assign_node_ranks({{0, true}, {3, false}}, ranks).find("--node-rank 3"), std::string::npos);
  EXPECT_NE(assign_node_ranks({{1, true}, {0, false}}, ranks).find("node rank 0 must run on the host"),
            std::string::npos);
}
