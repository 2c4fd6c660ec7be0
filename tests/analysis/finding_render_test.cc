// The wording of findings from their fields: one summary and one action per kind and cause path,
// checked on hand-built findings (the detector and engine tests check the fields themselves).
#include "analysis/finding_render.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/finding.h"

namespace stepwatch::analysis {
namespace {

Finding Make(FindingKind kind, Cause cause) {
  Finding f;
  f.kind = kind;
  f.job = "j";
  f.persistent = true;
  SetCause(&f, cause);
  return f;
}

TEST(FindingRenderTest, StragglerDataLoadingNamesItsDeviceFiguresToo) {
  Finding f = Make(FindingKind::kStraggler, Cause::kDataLoading);
  f.rank = 3;
  f.node = "node-1";
  f.gpu = 2;
  f.evidence.data_excess_seconds = 0.25;
  f.evidence.compute_vs_median_ratio = 1.02;  // the data excess is what the summary names
  DeviceEvidence d;
  d.node = "node-1";
  d.gpu = 2;
  d.power_watts = 398;
  d.power_limit_watts = 400;
  d.host_cpu_ratio = 0.97;
  f.evidence.devices.push_back(d);
  EXPECT_EQ(RenderSummary(f),
            "rank 3 on node-1 GPU 2: data loading +250 ms vs peers; at power cap (398 of 400 W); "
            "host CPU 97%");
  EXPECT_EQ(RenderAction(f), "more data-loader workers or faster storage on node-1");
  f.persistent = false;
  EXPECT_THAT(RenderSummary(f), ::testing::EndsWith(" (transient so far)"));
}

TEST(FindingRenderTest, APowerCapReasonIsNotRepeatedAsAPowerDraw) {
  Finding f = Make(FindingKind::kStraggler, Cause::kPowerThrottling);
  f.rank = 1;
  f.evidence.busy_vs_median_ratio = 1.2;
  DeviceEvidence d;
  d.gpu = 0;
  d.throttle_reasons = 0x4;
  d.power_watts = 400;
  d.power_limit_watts = 400;
  f.evidence.devices.push_back(d);
  EXPECT_EQ(RenderSummary(f), "rank 1: busy +20% vs peers; slower GPU: power capping");
  // No node and no GPU index: the advice says so rather than naming nothing.
  EXPECT_EQ(RenderAction(f),
            "drain its node or inspect its node's GPUs: power limit and power supply");
}

TEST(FindingRenderTest, SlowNodeWithDataLoadingAndAHotGpu) {
  Finding f = Make(FindingKind::kSlowNode, Cause::kDataLoading);
  f.causes = {Cause::kDataLoading, Cause::kThermalThrottling};
  f.node = "node-4";
  f.evidence.slow_rank_count = 3;
  f.evidence.node_rank_count = 4;
  f.evidence.busy_vs_median_ratio = 1.4;
  f.evidence.data_excess_seconds = 0.1;
  DeviceEvidence d;
  d.node = "node-4";
  d.gpu = 1;
  d.sm_clock_mhz = 1200;
  d.sm_clock_max_mhz = 1980;
  d.throttle_reasons = 0x20;
  f.evidence.devices.push_back(d);
  EXPECT_EQ(RenderSummary(f),
            "node-4: 3 of 4 ranks slow, busy +40% vs peers; data loading +100 ms vs peers; GPU "
            "1: SM clock 1200 of 1980 MHz, thermal throttling");
  EXPECT_EQ(RenderAction(f),
            "drain node-4 or inspect its storage and data loading (more data-loader workers)");
}

TEST(FindingRenderTest, PipelineNamesItsSlowerDevicesAndNodes) {
  Finding f = Make(FindingKind::kPipelineImbalance, Cause::kHardwareSlowdown);
  f.stage = 1;
  f.evidence.stage_vs_median_ratio = 1.5;
  f.evidence.stage_busy_seconds = 0.75;
  f.evidence.other_stages_busy_seconds = 0.5;
  f.evidence.nodes = {"a", "b", "c", "d"};
  f.evidence.node_count = 6;
  DeviceEvidence d;
  d.rank = 5;
  d.node = "b";
  d.gpu = 1;
  d.throttle_reasons = 0x8;
  d.utilization_ratio = 0.3;
  f.evidence.devices.push_back(d);
  EXPECT_EQ(RenderSummary(f),
            "stage 1 takes 1.5x the other stages (busy 750 ms vs 500 ms); its ranks run on a, b, "
            "c, d and 2 more; slower devices: rank 5 on b GPU 1: hardware slowdown, GPU "
            "utilization 30%");
  EXPECT_EQ(RenderAction(f),
            "drain b and inspect b GPU 1 (hardware slowdown: power brake, faulty part)");
}

TEST(FindingRenderTest, UnderutilizedGpuCausePaths) {
  Finding f = Make(FindingKind::kUnderutilizedGpu, Cause::kUnknown);
  f.node = "n";
  f.gpu = 0;
  f.rank = 2;
  f.evidence.utilization_threshold_ratio = 0.5;
  f.evidence.below_threshold_seconds = 42;
  DeviceEvidence d;
  d.sm_activity_ratio = 0.2;
  f.evidence.devices.push_back(d);
  EXPECT_EQ(RenderSummary(f),
            "n GPU 0 (rank 2): SM activity 20% < 50% for 42 s; cause unclear: the step split "
            "shows little waiting (small kernels or launch-bound)");
  SetCause(&f, Cause::kImbalance);
  f.evidence.comm_share_ratio = 0.1;
  f.evidence.imbalance_share_ratio = 0.25;
  EXPECT_THAT(RenderSummary(f),
              ::testing::EndsWith("communication bound (exposed communication and waiting 35% "
                                  "of the step)"));
  EXPECT_THAT(RenderAction(f), ::testing::HasSubstr("find the ranks the others wait for"));
}

TEST(FindingRenderTest, RegressionOfComputeAdvisesLookingForAChange) {
  Finding f = Make(FindingKind::kRegression, Cause::kUnknown);
  f.since_step = 300;
  f.evidence.step_seconds = 1.2;
  f.evidence.baseline_step_seconds = 1.0;
  f.evidence.step_vs_baseline_ratio = 1.2;
  f.evidence.rise_seconds = 0.2;
  EXPECT_EQ(RenderSummary(f),
            "step time up 20% since step 300: 1.20 s vs 1.00 s before; largest rise: compute "
            "+200 ms per step");
  EXPECT_EQ(RenderAction(f),
            "compute rose on every rank: look for a change of code, inputs or GPU clocks");
  f.evidence.rise_seconds.reset();
  EXPECT_EQ(RenderAction(f), "profile a step (no dominant loss in the step's split)");
}

TEST(FindingRenderTest, StallListsAtMost16RanksThenTheCount) {
  Finding f = Make(FindingKind::kStall, Cause::kRankExited);
  f.since_step = 7;
  for (int r = 0; r < 20; ++r) f.ranks.push_back(r);
  f.evidence.stall_limit_seconds = 30;
  f.evidence.silent_rank_count = 20;
  f.evidence.waiting_rank_count = 1;
  f.evidence.waiting_ranks = {20};
  f.evidence.exited_rank_count = 2;
  f.evidence.exited_ranks = {4, 9};
  EXPECT_EQ(RenderSummary(f),
            "no step progress for over 30.00 s after step 7; silent ranks (behind): "
            "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,... (20 in all); waiting ranks: 20; ranks 4,9 "
            "exited (process gone)");
  EXPECT_EQ(RenderAction(f), "read the logs of ranks 4,9 (exited); the other ranks wait for them");
}

TEST(FindingRenderTest, RenderFindingSetsBoth) {
  Finding f = Make(FindingKind::kIdleGpu, Cause::kNoWork);
  f.node = "n";
  f.gpu = 3;
  f.evidence.below_threshold_seconds = 31;
  DeviceEvidence d;
  d.utilization_ratio = 0.0;
  f.evidence.devices.push_back(d);
  RenderFinding(&f);
  EXPECT_EQ(f.summary, "n GPU 3: no process, utilization 0% for 31 s (idle capacity)");
  EXPECT_EQ(f.action, "schedule work on n GPU 3 or release it");
}

}  // namespace
}  // namespace stepwatch::analysis
