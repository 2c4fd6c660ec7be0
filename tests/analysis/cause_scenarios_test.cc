// Scenarios of sim/scenarios through the engine: the finding names the right rank and its cause.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "sim/scenario.h"
#include "sim/scenario_eval.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::sim {
namespace {

using ::testing::HasSubstr;

// The episodes of `kind` in the named scenario.
std::vector<Episode> EpisodesOf(const std::string& name, analysis::FindingKind kind) {
  auto sc = LoadScenario(std::string(STEPWATCH_SCENARIO_DIR) + "/" + name + ".json");
  EXPECT_OK(sc);
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
  EXPECT_EQ(eps[0].cause, analysis::Cause::kMoreWork) << eps[0].summary;
  ASSERT_EQ(eps[0].evidence.devices.size(), 1u);
  const analysis::DeviceEvidence& d = eps[0].evidence.devices[0];
  EXPECT_FALSE(d.throttle_reasons.has_value()) << "throttled, yet more work";
  EXPECT_GE(d.sm_activity_ratio.value_or(d.utilization_ratio.value_or(0)),
            analysis::EngineOptions().underutil_threshold);
  EXPECT_GT(eps[0].evidence.compute_vs_median_ratio.value_or(0), 1);
}

TEST(CauseScenariosTest, ThrottledGpuIsASlowerGpu) {
  auto eps = EpisodesOf("throttled-gpu-mild", analysis::FindingKind::kStraggler);
  ASSERT_EQ(eps.size(), 1u);
  EXPECT_EQ(eps[0].rank, 9);
  EXPECT_EQ(eps[0].cause, analysis::Cause::kThermalThrottling) << eps[0].summary;
  ASSERT_EQ(eps[0].evidence.devices.size(), 1u);
  const analysis::DeviceEvidence& d = eps[0].evidence.devices[0];
  ASSERT_TRUE(d.sm_clock_mhz && d.sm_clock_max_mhz) << eps[0].summary;
  EXPECT_LT(*d.sm_clock_mhz, analysis::EngineOptions().low_clock_ratio * *d.sm_clock_max_mhz);
  EXPECT_NE(d.throttle_reasons.value_or(0) & 0x60, 0u) << "no thermal throttle reason";
  EXPECT_GT(d.temperature_celsius.value_or(0), 80) << "the hot GPU's temperature is evidence";
  // The same evidence, rendered.
  EXPECT_THAT(eps[0].summary, HasSubstr("slower GPU: SM clock"));
}

// A regression names what rose with the step time, not merely the largest share of it.
TEST(CauseScenariosTest, RegressionNamesWhatRose) {
  auto comm = EpisodesOf("comm-slowdown-2x", analysis::FindingKind::kRegression);
  ASSERT_FALSE(comm.empty());
  EXPECT_EQ(comm[0].cause, analysis::Cause::kExposedComm) << comm[0].summary;
  EXPECT_GT(comm[0].evidence.rise_seconds.value_or(0), 0);
  auto data = EpisodesOf("data-stall", analysis::FindingKind::kRegression);
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(data[0].cause, analysis::Cause::kDataLoading) << data[0].summary;
  EXPECT_GT(data[0].evidence.rise_seconds.value_or(0), 0);
  auto slow = EpisodesOf("slow-rank-30pct", analysis::FindingKind::kRegression);
  ASSERT_FALSE(slow.empty());
  EXPECT_EQ(slow[0].cause, analysis::Cause::kImbalance) << slow[0].summary;
  EXPECT_THAT(slow[0].summary, HasSubstr("largest rise: waiting for slower ranks"));
}

}  // namespace
}  // namespace stepwatch::sim
