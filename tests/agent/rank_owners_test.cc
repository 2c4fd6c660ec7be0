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

}  // namespace
}  // namespace stepwatch::agent
