#include "agent/rank_owners.h"

#include <set>

#include "gtest/gtest.h"

namespace stepwatch::agent {
namespace {

struct Processes {
  std::set<pid_t> gone;
  RankOwnersOptions Options(size_t max_bindings = 65536) {
    RankOwnersOptions o;
    o.max_bindings = max_bindings;
    o.process_gone = [this](pid_t pid) { return gone.count(pid) > 0; };
    return o;
  }
};

TEST(RankOwnersTest, TheFirstReporterOwnsTheRankWhileItRuns) {
  Processes procs;
  RankOwners owners(procs.Options());
  EXPECT_EQ(owners.Claim("job", 3, 100), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.Claim("job", 3, 100), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.Claim("job", 3, 200), RankOwners::Verdict::kNotOwner);  // forged
  EXPECT_EQ(owners.Owner("job", 3), 100);
  // Other ranks and other jobs are separate bindings.
  EXPECT_EQ(owners.Claim("job", 4, 200), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.Claim("other", 3, 200), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.size(), 3u);
}

TEST(RankOwnersTest, ARestartedRankTakesOverOnceTheOldProcessIsGone) {
  Processes procs;
  RankOwners owners(procs.Options());
  ASSERT_EQ(owners.Claim("job", 0, 100), RankOwners::Verdict::kAccepted);
  ASSERT_EQ(owners.Claim("job", 0, 101), RankOwners::Verdict::kNotOwner);
  procs.gone.insert(100);
  EXPECT_EQ(owners.Claim("job", 0, 101), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.Owner("job", 0), 101);
  // The rank is 101's now, and 101 runs.
  EXPECT_EQ(owners.Claim("job", 0, 100), RankOwners::Verdict::kNotOwner);
  EXPECT_EQ(owners.Owner("job", 0), 101);
}

TEST(RankOwnersTest, UnknownSendersAreNotBound) {
  Processes procs;
  RankOwners owners(procs.Options());
  EXPECT_EQ(owners.Claim("job", 0, 0), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.size(), 0u);
}

TEST(RankOwnersTest, AFloodOfInventedRanksCannotEvictLiveBindings) {
  Processes procs;
  RankOwners owners(procs.Options(/*max_bindings=*/4));
  ASSERT_EQ(owners.Claim("real", 0, 10), RankOwners::Verdict::kAccepted);
  for (int r = 0; r < 3; ++r)
    ASSERT_EQ(owners.Claim("junk", r, 66), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.Claim("junk", 3, 66), RankOwners::Verdict::kFull);
  EXPECT_EQ(owners.Owner("real", 0), 10);
  // Once the flooding process is gone its bindings are swept and room is made.
  procs.gone.insert(66);
  EXPECT_EQ(owners.Claim("real", 1, 10), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.size(), 2u);
  EXPECT_EQ(owners.Owner("junk", 0), 0);
}

// One tenant fills its own share only: a process beyond max_per_process and a user beyond
// max_per_user are refused, and other users' new ranks still get in.
TEST(RankOwnersTest, OneProcessOrUserCannotTakeTheWholeTable) {
  Processes procs;
  RankOwnersOptions o = procs.Options(/*max_bindings=*/100);
  o.max_per_process = 10;
  o.max_per_user = 15;
  RankOwners owners(o);
  for (int r = 0; r < 10; ++r)
    ASSERT_EQ(owners.Claim("flood", r, 66, 1000), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.Claim("flood", 10, 66, 1000), RankOwners::Verdict::kProcessLimit);
  EXPECT_EQ(owners.Claim("flood2", 0, 66, 1000), RankOwners::Verdict::kProcessLimit);
  // The ranks it owns still go through.
  EXPECT_EQ(owners.Claim("flood", 3, 66, 1000), RankOwners::Verdict::kAccepted);
  // A second process of the same user: up to the user's bound.
  for (int r = 0; r < 5; ++r)
    ASSERT_EQ(owners.Claim("flood3", r, 67, 1000), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.Claim("flood3", 5, 67, 1000), RankOwners::Verdict::kUserLimit);
  EXPECT_EQ(owners.OwnedByProcess(66), 10u);
  EXPECT_EQ(owners.OwnedByUser(1000), 15u);
  // Another user is admitted.
  EXPECT_EQ(owners.Claim("theirs", 0, 70, 1001), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.OwnedByUser(1001), 1u);
  // Once the first flooder exits, its share returns to its user (for the next process that asks:
  // the refused one's own retries sweep only once per many refusals).
  procs.gone.insert(66);
  EXPECT_EQ(owners.Claim("flood3", 5, 68, 1000), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.OwnedByProcess(66), 0u);
  EXPECT_EQ(owners.OwnedByUser(1000), 6u);
  EXPECT_EQ(owners.size(), 7u);
}

// A dead owner's rank taken over counts against the new process and leaves the old one's count.
TEST(RankOwnersTest, TakeoversMoveTheCounts) {
  Processes procs;
  RankOwnersOptions o = procs.Options();
  o.max_per_process = 1;
  RankOwners owners(o);
  ASSERT_EQ(owners.Claim("job", 0, 100, 1), RankOwners::Verdict::kAccepted);
  ASSERT_EQ(owners.Claim("job", 1, 101, 2), RankOwners::Verdict::kAccepted);
  procs.gone.insert(100);
  // 101 is at its bound: it cannot take rank 0 over either.
  EXPECT_EQ(owners.Claim("job", 0, 101, 2), RankOwners::Verdict::kProcessLimit);
  EXPECT_EQ(owners.Claim("job", 0, 102, 3), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.OwnedByProcess(100), 0u);
  EXPECT_EQ(owners.OwnedByUser(1), 0u);
  EXPECT_EQ(owners.OwnedByUser(3), 1u);
  EXPECT_EQ(owners.size(), 2u);
}

// Under one process's flood of refusals the table is swept once per many refusals, yet another
// process's claim sweeps at once (a job whose processes exited makes room for a new one).
TEST(RankOwnersTest, RefusalsDoNotSweepOnEveryMessage) {
  Processes procs;
  int checks = 0;
  RankOwnersOptions o = procs.Options(/*max_bindings=*/4);
  o.process_gone = [&](pid_t pid) {
    ++checks;
    return procs.gone.count(pid) > 0;
  };
  RankOwners owners(o);
  for (int r = 0; r < 4; ++r)
    ASSERT_EQ(owners.Claim("a", r, 66 + r % 2), RankOwners::Verdict::kAccepted);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(owners.Claim("x", i, 66), RankOwners::Verdict::kFull);
  EXPECT_LE(checks, 2);
  procs.gone.insert(67);
  EXPECT_EQ(owners.Claim("new", 0, 70), RankOwners::Verdict::kAccepted);
  EXPECT_EQ(owners.size(), 3u);
}

}  // namespace
}  // namespace stepwatch::agent
