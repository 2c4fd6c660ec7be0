#include "analysis/detectors/stall.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/analysis/detectors/fixture.h"

namespace stepwatch::analysis {
namespace {

using testing::DetectorFixture;
using ::testing::HasSubstr;

constexpr int64_t kSecond = 1'000'000'000;

TEST(EngineStallDetectorTest, NamesTheSilentRanksAndEndsWithTheNextStep) {
  StallDetector stall;
  DetectorFixture fx({&stall}, 2);
  for (int r = 0; r < 2; ++r) fx.AddRank(r, "node-0", r);
  for (int64_t s = 0; s < 10; ++s) fx.Step(s, 1.0, {0.9, 0.9});
  fx.job().ranks.Mutable(1).last_step = 8;  // rank 1 fell silent a step earlier
  fx.Advance(9 * kSecond + 30 * kSecond);   // the 30 s floor, not yet over it
  EXPECT_TRUE(fx.Findings().empty());
  fx.Advance(9 * kSecond + 31 * kSecond);

  std::vector<Finding> found = fx.Findings();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, FindingKind::kStall);
  EXPECT_EQ(found[0].severity, Severity::kCritical);
  EXPECT_EQ(found[0].since_step, 9);
  EXPECT_EQ(found[0].since_unix_nanos, 9 * kSecond);
  EXPECT_EQ(found[0].cause, Cause::kHang);
  EXPECT_EQ(found[0].ranks, std::vector<int>{1});
  const Evidence& e = found[0].evidence;
  EXPECT_DOUBLE_EQ(e.stall_limit_seconds.value_or(0), 30);
  EXPECT_DOUBLE_EQ(e.median_step_seconds.value_or(0), 1.0);
  EXPECT_EQ(e.silent_rank_count, 1);
  EXPECT_EQ(e.waiting_rank_count, 1);
  EXPECT_EQ(e.waiting_ranks, std::vector<int>{0});
  EXPECT_EQ(e.exited_rank_count, 0);
  EXPECT_EQ(found[0].summary,
            "no step progress for over 30.00 s after step 9; silent ranks (behind): 1; waiting "
            "ranks: 0");

  fx.job().ranks.Mutable(1).exited = true;
  found = fx.Findings();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kRankExited);
  EXPECT_EQ(found[0].evidence.exited_ranks, std::vector<int>{1});
  EXPECT_THAT(found[0].summary, HasSubstr("; rank 1 exited (process gone)"));
  EXPECT_EQ(found[0].action, "read the logs of rank 1 (exited); the other ranks wait for it");

  fx.Step(10, 1.0, {0.9, 0.9});
  EXPECT_TRUE(fx.Findings().empty()) << "a new step did not end the stall";
}

}  // namespace
}  // namespace stepwatch::analysis
