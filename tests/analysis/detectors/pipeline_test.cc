#include "analysis/detectors/pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/analysis/detectors/fixture.h"

namespace stepwatch::analysis {
namespace {

using testing::DetectorFixture;
using ::testing::HasSubstr;

TEST(EnginePipelineDetectorTest, FlagsTheSlowestStageAndClears) {
  PipelineDetector pipeline;
  DetectorFixture fx({&pipeline}, 4);
  for (int r = 0; r < 4; ++r) fx.AddRank(r, "node-" + std::to_string(r), 0, /*pp_stage=*/r);
  const std::vector<int64_t> groups = {0, int64_t{1} << 32, int64_t{2} << 32, int64_t{3} << 32};
  for (int64_t s = 0; s < 15; ++s) fx.Step(s, 1.0, {0.50, 0.50, 0.50, 0.80}, groups);
  EXPECT_TRUE(fx.Findings().empty()) << "flagged before every stage had a full window";
  fx.Step(15, 1.0, {0.50, 0.50, 0.50, 0.80}, groups);

  std::vector<Finding> found = fx.Findings();
  ASSERT_EQ(found.size(), 1u);
  const Finding& f = found[0];
  EXPECT_EQ(f.kind, FindingKind::kPipelineImbalance);
  EXPECT_EQ(f.stage, 3);
  EXPECT_EQ(f.ranks, std::vector<int>{3});
  EXPECT_EQ(f.node, "node-3");
  EXPECT_EQ(f.since_step, 15);
  EXPECT_EQ(f.cause, Cause::kMoreWork);
  EXPECT_NEAR(f.evidence.stage_vs_median_ratio.value_or(0), 1.6, 1e-6);
  EXPECT_NEAR(f.evidence.stage_busy_seconds.value_or(0), 0.8, 1e-6);
  EXPECT_NEAR(f.evidence.other_stages_busy_seconds.value_or(0), 0.5, 1e-6);
  EXPECT_EQ(f.evidence.node_count, 1);
  EXPECT_EQ(f.evidence.nodes, std::vector<std::string>{"node-3"});
  EXPECT_TRUE(f.evidence.devices.empty()) << "no slower device to name";
  EXPECT_THAT(f.action, HasSubstr("move layers off stage 3"));
  EXPECT_TRUE(fx.Rank(3).straggler);
  EXPECT_FALSE(fx.Rank(0).straggler);

  for (int64_t s = 16; s < 40; ++s) fx.Step(s, 1.0, {0.50, 0.50, 0.50, 0.52}, groups);
  EXPECT_TRUE(fx.Findings().empty());
}

}  // namespace
}  // namespace stepwatch::analysis
