// Scenarios of sim/scenarios through the engine: the finding names the right rank and its cause.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "sim/scenario.h"
#include "sim/scenario_eval.h"

namespace stepwatch::sim {
namespace {

using ::testing::HasSubstr;

// The episodes of `kind` in the named scenario.
std::vector<Episode> EpisodesOf(const std::string& name, analysis::FindingKind kind) {
  auto sc = LoadScenario(std::string(STEPWATCH_SCENARIO_DIR) + "/" + name + ".json");
  EXPECT_TRUE(sc.ok()) << sc.status();
  if (!sc.ok()) return {};
  std::vector<Episode> out;
  for (const Episode& e : RunScenario(*sc).episodes) {
    if (e.kind == kind) out.push_back(e);
  }
  return out;
}

TEST(CauseScenariosTest, TwoRankJobStragglerIsTheSlowRank) {
  auto eps = EpisodesOf("slow-rank-2-ranks", analysis::FindingKind::kStraggler);
  ASSERT_EQ(eps.size(), 1u);
  EXPECT_EQ(eps[0].rank, 1) << eps[0].summary;
  EXPECT_GE(eps[0].start_step, 600);
  EXPECT_LE(eps[0].start_step, 640);
  EXPECT_NE(eps[0].end_step, -1);  // cleared after the fault ended
}

TEST(CauseScenariosTest, HealthyTwoRankJobHasNoStraggler) {
  EXPECT_TRUE(EpisodesOf("healthy-2-ranks-cv5", analysis::FindingKind::kStraggler).empty());
}

TEST(CauseScenariosTest, UnevenWorkAtFullClocksIsMoreWork) {
  auto eps = EpisodesOf("more-work-one-rank", analysis::FindingKind::kStraggler);
  ASSERT_EQ(eps.size(), 1u);
  EXPECT_EQ(eps[0].rank, 11);
  EXPECT_THAT(eps[0].summary, HasSubstr("more work than its peers at full clocks"));
}

TEST(CauseScenariosTest, ThrottledGpuIsASlowerGpu) {
  auto eps = EpisodesOf("throttled-gpu-mild", analysis::FindingKind::kStraggler);
  ASSERT_EQ(eps.size(), 1u);
  EXPECT_EQ(eps[0].rank, 9);
  EXPECT_THAT(eps[0].summary, HasSubstr("slower GPU: SM clock"));
  EXPECT_THAT(eps[0].summary, HasSubstr("thermal throttling"));
}

// A regression names what rose with the step time, not merely the largest share of it.
TEST(CauseScenariosTest, RegressionNamesWhatRose) {
  auto comm = EpisodesOf("comm-slowdown-2x", analysis::FindingKind::kRegression);
  ASSERT_FALSE(comm.empty());
  EXPECT_THAT(comm[0].summary, HasSubstr("largest rise: exposed communication"));
  auto data = EpisodesOf("data-stall", analysis::FindingKind::kRegression);
  ASSERT_FALSE(data.empty());
  EXPECT_THAT(data[0].summary, HasSubstr("largest rise: data loading"));
  auto slow = EpisodesOf("slow-rank-30pct", analysis::FindingKind::kRegression);
  ASSERT_FALSE(slow.empty());
  EXPECT_THAT(slow[0].summary, HasSubstr("largest rise: waiting for slower ranks"));
}

}  // namespace
}  // namespace stepwatch::sim
