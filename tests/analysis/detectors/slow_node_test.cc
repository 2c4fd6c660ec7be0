#include "analysis/detectors/slow_node.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "analysis/detectors/straggler.h"
#include "tests/analysis/detectors/fixture.h"

namespace stepwatch::analysis {
namespace {

using testing::DetectorFixture;
using ::testing::HasSubstr;

TEST(EngineSlowNodeDetectorTest, ReplacesTheStragglersOfAWhollySlowNode) {
  StragglerDetector straggler;
  SlowNodeDetector slow_node(&straggler);
  DetectorFixture fx({&straggler, &slow_node}, 6);
  for (int r = 0; r < 6; ++r) fx.AddRank(r, "node-" + std::to_string(r / 2), r % 2);
  GpuSample g;
  g.node = "node-0";
  g.index = 1;
  g.throttle_reasons = 0x4;  // power capping
  fx.registry().UpdateGpu(g);
  // 32 steps: the recent scores are then all against the fast cluster's mean (0.30), not the mean
  // of all six of the first steps.
  for (int64_t s = 0; s < 32; ++s) fx.Step(s, 0.6, {0.40, 0.41, 0.30, 0.31, 0.29, 0.30});

  std::vector<Finding> found = fx.Findings();
  ASSERT_EQ(found.size(), 1u) << "the node's straggler findings were not replaced";
  const Finding& f = found[0];
  EXPECT_EQ(f.kind, FindingKind::kSlowNode);
  EXPECT_EQ(f.node, "node-0");
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(f.since_step, 0);
  EXPECT_EQ(f.severity, Severity::kWarning);
  EXPECT_EQ(f.cause, Cause::kPowerThrottling);
  EXPECT_EQ(f.evidence.slow_rank_count, 2);
  EXPECT_EQ(f.evidence.node_rank_count, 2);
  EXPECT_NEAR(f.evidence.busy_vs_median_ratio.value_or(0), 0.405 / 0.30, 0.02);
  ASSERT_EQ(f.evidence.devices.size(), 1u) << "only the throttled GPU is evidence";
  EXPECT_EQ(f.evidence.devices[0].gpu, 1);
  EXPECT_EQ(f.evidence.devices[0].throttle_reasons, uint64_t{0x4});
  EXPECT_THAT(f.summary, HasSubstr("GPU 1: power capping"));
  EXPECT_THAT(f.action, HasSubstr("drain node-0"));
}

TEST(EngineSlowNodeDetectorTest, OneSlowRankOfANodeStaysAStraggler) {
  StragglerDetector straggler;
  SlowNodeDetector slow_node(&straggler);
  DetectorFixture fx({&straggler, &slow_node}, 6);
  for (int r = 0; r < 6; ++r) fx.AddRank(r, "node-" + std::to_string(r / 2));
  for (int64_t s = 0; s < 16; ++s) fx.Step(s, 0.6, {0.40, 0.30, 0.30, 0.31, 0.29, 0.30});
  std::vector<Finding> found = fx.Findings();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, FindingKind::kStraggler);
  EXPECT_EQ(found[0].rank, 0);
}

}  // namespace
}  // namespace stepwatch::analysis
