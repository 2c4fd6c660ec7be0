#include "analysis/detectors/regression.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/analysis/detectors/fixture.h"

namespace stepwatch::analysis {
namespace {

using testing::DetectorFixture;
using ::testing::HasSubstr;

TEST(EngineRegressionDetectorTest, FindsTheShiftItsStepAndWhatRose) {
  RegressionDetector regression;
  DetectorFixture fx({&regression}, 3);
  for (int r = 0; r < 3; ++r) fx.AddRank(r, "node-0", r);
  // Balanced at 1.0 s, then rank 2 busier: the others wait for it (imbalance rises).
  for (int64_t s = 0; s < 64; ++s) fx.Step(s, 1.0, {0.8, 0.8, 0.8});
  EXPECT_TRUE(fx.Findings().empty());
  for (int64_t s = 64; s < 80; ++s) fx.Step(s, 1.3, {0.8, 0.8, 1.1});

  std::vector<Finding> found = fx.Findings();
  ASSERT_EQ(found.size(), 1u);
  const Finding& f = found[0];
  EXPECT_EQ(f.kind, FindingKind::kRegression);
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.since_step, 64);
  EXPECT_EQ(f.cause, Cause::kImbalance);
  EXPECT_NEAR(f.evidence.step_seconds.value_or(0), 1.3, 1e-6);
  EXPECT_NEAR(f.evidence.baseline_step_seconds.value_or(0), 1.0, 1e-6);
  EXPECT_NEAR(f.evidence.step_vs_baseline_ratio.value_or(0), 1.3, 1e-6);
  EXPECT_NEAR(f.evidence.rise_seconds.value_or(0), 0.3, 1e-6);
  // One rendering check: the summary words the same fields.
  EXPECT_EQ(f.summary,
            "step time up 30% since step 64: 1.30 s vs 1.00 s before; largest rise: waiting for "
            "slower ranks +300 ms per step");

  for (int64_t s = 80; s < 100; ++s) fx.Step(s, 1.0, {0.8, 0.8, 0.8});
  EXPECT_TRUE(fx.Findings().empty()) << "not cleared back at the reference level";
}

TEST(EngineRegressionDetectorTest, WindowsComeFromTheOptions) {
  EngineOptions opt;
  opt.regression_window = 4;
  opt.regression_reference = 8;
  RegressionDetector regression;
  DetectorFixture fx({&regression}, 2, opt);
  for (int r = 0; r < 2; ++r) fx.AddRank(r, "node-0", r);
  for (int64_t s = 0; s < 12; ++s) fx.Step(s, 1.0, {0.8, 0.8});
  for (int64_t s = 12; s < 16; ++s) fx.Step(s, 1.5, {0.8, 0.8});
  std::vector<Finding> found = fx.Findings();
  ASSERT_EQ(found.size(), 1u) << "a 4-step window should see a 4-step shift";
  EXPECT_EQ(found[0].since_step, 12);
}

}  // namespace
}  // namespace stepwatch::analysis
