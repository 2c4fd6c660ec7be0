#include "analysis/detectors/straggler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/analysis/detectors/fixture.h"

namespace stepwatch::analysis {
namespace {

using testing::DetectorFixture;
using ::testing::HasSubstr;

class EngineStragglerDetectorTest : public ::testing::Test {
 protected:
  EngineStragglerDetectorTest() : fx_({&straggler_}, 4) {
    for (int r = 0; r < 4; ++r) fx_.AddRank(r, "node-" + std::to_string(r), /*gpu=*/0);
  }
  void Steps(int64_t from, int64_t to, double slow) {
    for (int64_t s = from; s < to; ++s) fx_.Step(s, 0.6, {0.30, 0.31, slow, 0.29});
  }

  StragglerDetector straggler_;
  DetectorFixture fx_;
};

TEST_F(EngineStragglerDetectorTest, FlagsTheBusierRankOnceItsNoiseIsKnownAndClears) {
  // Before the ranks' own noise is known, the spread across the healthy peers stands for it, once
  // four steps (with four peers) have measured it; one step adds at most half the threshold, so
  // no single step flags a rank.
  Steps(0, 4, 0.48);
  EXPECT_TRUE(fx_.Findings().empty()) << "flagged before any noise was measured";
  Steps(4, 12, 0.48);
  ASSERT_EQ(fx_.Findings().size(), 1u) << "not flagged within 12 steps";
  // The evidence is the recent scores: against the mean of all four (0.345) until the split into
  // a fast cluster and rank 2 is seen, then against the fast cluster's (0.30).
  Steps(12, 30, 0.48);
  std::vector<Finding> found = fx_.Findings();
  ASSERT_EQ(found.size(), 1u);
  const Finding& f = found[0];
  EXPECT_EQ(f.kind, FindingKind::kStraggler);
  EXPECT_EQ(f.job, "job");
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.ranks, std::vector<int>{2});
  EXPECT_EQ(f.node, "node-2");
  EXPECT_EQ(f.gpu, 0);
  EXPECT_EQ(f.since_step, 0);                  // slow from the first step it reported
  EXPECT_EQ(f.severity, Severity::kCritical);  // 0.48 / 0.30 >= critical_ratio 1.5
  EXPECT_FALSE(f.persistent);
  EXPECT_EQ(f.cause, Cause::kUnknown);
  EXPECT_NEAR(f.evidence.compute_vs_median_ratio.value_or(0), 0.48 / 0.30, 0.02);
  EXPECT_NEAR(f.evidence.busy_vs_median_ratio.value_or(0), 0.48 / 0.30, 0.02);
  EXPECT_FALSE(f.evidence.data_excess_seconds.has_value());
  EXPECT_FALSE(f.evidence.section.has_value());
  ASSERT_EQ(f.evidence.devices.size(), 1u);
  EXPECT_EQ(f.evidence.devices[0].gpu, -1) << "no GPU readings";
  EXPECT_THAT(f.summary, HasSubstr("rank 2 on node-2 GPU 0: compute +60"));
  EXPECT_THAT(f.summary, HasSubstr("% vs peers; cause unknown (no GPU readings) "
                                   "(transient so far)"));

  const RankSnapshot rs = fx_.Rank(2);
  EXPECT_TRUE(rs.straggler);
  EXPECT_TRUE(rs.comparable);
  EXPECT_NEAR(rs.busy_vs_median_ratio, 0.48 / 0.30, 0.02);
  EXPECT_FALSE(fx_.Rank(0).straggler);

  Steps(30, 54, 0.30);
  EXPECT_TRUE(fx_.Findings().empty()) << "not cleared after recovery";
}

TEST_F(EngineStragglerDetectorTest, NamesTheThrottledGpuOfTheRegistry) {
  GpuSample g;
  g.node = "node-2";
  g.index = 0;
  g.sm_clock_mhz = 1410;
  g.sm_clock_max_mhz = 1980;
  g.throttle_reasons = 0x20;  // thermal
  fx_.registry().UpdateGpu(g);
  Steps(0, 16, 0.40);
  std::vector<Finding> found = fx_.Findings();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].cause, Cause::kThermalThrottling);
  EXPECT_EQ(found[0].causes, std::vector<Cause>{Cause::kThermalThrottling});
  EXPECT_EQ(found[0].severity, Severity::kWarning);
  ASSERT_EQ(found[0].evidence.devices.size(), 1u);
  const DeviceEvidence& d = found[0].evidence.devices[0];
  EXPECT_EQ(d.node, "node-2");
  EXPECT_EQ(d.gpu, 0);
  EXPECT_EQ(d.rank, 2);
  EXPECT_EQ(d.sm_clock_mhz, 1410);
  EXPECT_EQ(d.sm_clock_max_mhz, 1980);
  EXPECT_EQ(d.throttle_reasons, uint64_t{0x20});
  EXPECT_FALSE(d.host_cpu_ratio.has_value());
  EXPECT_THAT(found[0].summary,
              HasSubstr("slower GPU: SM clock 1410 of 1980 MHz, thermal throttling"));
  EXPECT_THAT(found[0].action, HasSubstr("drain node-2"));
}

TEST_F(EngineStragglerDetectorTest, ARemovedRankStartsAfresh) {
  Steps(0, 16, 0.48);
  ASSERT_EQ(fx_.Findings().size(), 1u);
  straggler_.OnRankRemoved(fx_.view(), 2, fx_.job().states[0].get());
  EXPECT_TRUE(fx_.Findings().empty());
  EXPECT_FALSE(fx_.Rank(2).comparable);
}

}  // namespace
}  // namespace stepwatch::analysis
