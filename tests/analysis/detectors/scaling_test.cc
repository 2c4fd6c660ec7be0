#include "analysis/detectors/scaling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/analysis/detectors/fixture.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis {
namespace {

using testing::DetectorFixture;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(EngineScalingDetectorTest, ComparesWithTheBestSmallerSizeOfTheHistory) {
  ScalingDetector scaling;
  ASSERT_OK(scaling.LoadHistory("stepwatch-scaling-history v1\njob\t4\t2\n"));
  DetectorFixture fx({&scaling}, 8);
  for (int r = 0; r < 8; ++r) fx.AddRank(r, "node-0", r);
  const std::vector<double> busy(8, 0.5);
  for (int64_t s = 0; s < 15; ++s) fx.Step(s, 1.0, busy);
  EXPECT_TRUE(fx.Findings().empty()) << "measured before the window filled";
  fx.Step(15, 1.0, busy);

  std::vector<Finding> found = fx.Findings();
  ASSERT_EQ(found.size(), 1u);
  const Finding& f = found[0];
  EXPECT_EQ(f.kind, FindingKind::kScalingEfficiency);
  EXPECT_EQ(f.since_step, 15);
  EXPECT_TRUE(f.persistent);
  EXPECT_EQ(f.cause, Cause::kExposedComm);
  EXPECT_DOUBLE_EQ(f.evidence.scaling_efficiency_ratio.value_or(0), 0.5);
  EXPECT_EQ(f.evidence.world_size, 8);
  EXPECT_EQ(f.evidence.reference_world_size, 4);
  EXPECT_NEAR(f.evidence.comm_share_ratio.value_or(0), 0.5, 1e-6);
  EXPECT_NEAR(f.evidence.imbalance_share_ratio.value_or(-1), 0, 1e-6);
  EXPECT_THAT(f.summary, HasSubstr("largest loss: exposed communication 50% of the step"));

  JobSnapshot snap;
  scaling.AnnotateJob(fx.view(), fx.job().states[0].get(), &snap);
  ASSERT_TRUE(snap.scaling_efficiency_ratio.has_value());
  EXPECT_DOUBLE_EQ(*snap.scaling_efficiency_ratio, 0.5);
  const std::string saved = scaling.SerializeHistory();
  EXPECT_THAT(saved, HasSubstr("job\t4\t2\n"));
  EXPECT_THAT(saved, HasSubstr("job\t8\t1\n"));
}

TEST(EngineScalingDetectorTest, HistoryKeepsAtMostMaxJobNamesForgettingTheStalest) {
  ScalingDetector scaling;
  ASSERT_OK(scaling.LoadHistory("stepwatch-scaling-history v1\nold-a\t4\t2\nold-b\t4\t2\n"));
  EngineOptions options;
  options.max_scaling_history_jobs = 2;
  DetectorFixture fx({&scaling}, 8, options);
  for (int r = 0; r < 8; ++r) fx.AddRank(r, "node-0", r);
  const std::vector<double> busy(8, 0.5);
  for (int64_t s = 0; s < 16; ++s) fx.Step(s, 1.0, busy);
  const std::string saved = scaling.SerializeHistory();
  EXPECT_THAT(saved, HasSubstr("job\t8\t1\n"));
  EXPECT_THAT(saved, Not(HasSubstr("old-a")));
  EXPECT_THAT(saved, HasSubstr("old-b\t4\t2\n"));
}

TEST(EngineScalingDetectorTest, RefusesAMalformedHistoryWhole) {
  ScalingDetector scaling;
  EXPECT_FALSE(scaling.LoadHistory("something else\n").ok());
  EXPECT_FALSE(scaling.LoadHistory("stepwatch-scaling-history v1\njob\t4\t2\njob\t-1\t2\n").ok());
  EXPECT_EQ(scaling.SerializeHistory(), "stepwatch-scaling-history v1\n");
}

}  // namespace
}  // namespace stepwatch::analysis
