// The cause, evidence and advice of each kind of finding through the whole engine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "analysis/engine.h"
#include "tests/analysis/job_driver.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis {
namespace {

using engine_test::AddGpus;
using engine_test::JobDriver;
using engine_test::kSec;
using engine_test::kT0;
using engine_test::Of;
using engine_test::Reading;
using engine_test::Split;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(EngineCauseTest, ThrottledGpuIsASlowerGpuWithDrainAdvice) {
  Engine e;
  JobDriver d(&e, "j", 2, 8);
  d.split = [](int rank, int64_t) { return Split{rank == 13 ? 0.4 * 1.31 : 0.4, 0.02}; };
  d.after_step = [&](int64_t) {
    AddGpus(&e, d, 2, 8, [](int n, int g, GpuSample& x) {
      if (n != 1 || g != 5) return;
      x.sm_clock_mhz = 1410;
      x.throttle_reasons = 0x40;
    });
  };
  d.Run(100);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].cause, Cause::kThermalThrottling);
  EXPECT_EQ(f[0].causes, std::vector<Cause>{Cause::kThermalThrottling});
  EXPECT_EQ(f[0].ranks, std::vector<int>{13});
  ASSERT_EQ(f[0].evidence.devices.size(), 1u);
  EXPECT_EQ(f[0].evidence.devices[0].sm_clock_mhz, 1410);
  EXPECT_THAT(f[0].action, HasSubstr("drain node-1"));
  EXPECT_THAT(f[0].action, HasSubstr("GPU 5"));
  EXPECT_STREQ(CauseName(f[0].cause), "thermal_throttling");
}

TEST(EngineCauseTest, UnevenWorkAtFullClocksIsMoreWork) {
  Engine e;
  JobDriver d(&e, "j", 2, 8);
  d.split = [](int rank, int64_t) { return Split{rank == 13 ? 0.4 * 1.31 : 0.4, 0.02}; };
  d.after_step = [&](int64_t) { AddGpus(&e, d, 2, 8); };
  d.Run(100);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 13);
  EXPECT_EQ(f[0].cause, Cause::kMoreWork);
  ASSERT_EQ(f[0].evidence.devices.size(), 1u);
  EXPECT_TRUE(f[0].evidence.devices[0].sm_clock_mhz.has_value() ||
              f[0].evidence.devices[0].sm_activity_ratio.has_value() ||
              f[0].evidence.devices[0].utilization_ratio.has_value());
  EXPECT_GE(f[0].evidence.devices[0].utilization_ratio.value_or(
                f[0].evidence.devices[0].sm_activity_ratio.value_or(0)),
            EngineOptions().underutil_threshold);
  EXPECT_THAT(f[0].summary, HasSubstr("more work than its peers at full clocks"));
  EXPECT_THAT(f[0].action, HasSubstr("sharding"));
}

TEST(EngineCauseTest, StragglerWithoutGpuReadingsHasUnknownCause) {
  Engine e;
  JobDriver d(&e, "j", 2, 8);
  d.split = [](int rank, int64_t) { return Split{rank == 13 ? 0.4 * 1.31 : 0.4, 0.02}; };
  d.Run(100);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].cause, Cause::kUnknown);
  EXPECT_TRUE(f[0].causes.empty());
  EXPECT_FALSE(f[0].action.empty());
}

TEST(EngineCauseTest, DataStallIsDataLoading) {
  Engine e;
  JobDriver d(&e, "j", 1, 8);
  d.split = [](int rank, int64_t) { return Split{0.4, rank == 6 ? 0.2 : 0.02}; };
  d.after_step = [&](int64_t) { AddGpus(&e, d, 1, 8); };
  d.Run(60);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].cause, Cause::kDataLoading);
  EXPECT_THAT(f[0].action, HasSubstr("data-loader workers"));
  EXPECT_THAT(f[0].action, HasSubstr("node-0"));
}

TEST(EngineCauseTest, SlowNodeMarksEveryRankAndAdvisesDrainingIt) {
  Engine e;
  JobDriver d(&e, "j", 4, 8);
  d.split = [](int rank, int64_t) { return Split{rank / 8 == 2 ? 0.5 : 0.4, 0.02}; };
  HostSample h;
  h.node = "node-2";
  h.cpu_utilization_ratio = 0.99;
  e.AddHost(h);
  d.after_step = [&](int64_t) {
    // One of the node's GPUs is also throttled: the node finding names it too.
    AddGpus(&e, d, 4, 8, [](int n, int g, GpuSample& x) {
      if (n == 2 && g == 3) x.throttle_reasons = 0x4;
    });
  };
  d.Run(60);
  auto f = Of(e, FindingKind::kSlowNode);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].ranks, (std::vector<int>{16, 17, 18, 19, 20, 21, 22, 23}));
  EXPECT_THAT(f[0].causes,
              ::testing::UnorderedElementsAre(Cause::kHostCpu, Cause::kPowerThrottling));
  bool gpu3 = false;
  for (const DeviceEvidence& d : f[0].evidence.devices) gpu3 = gpu3 || d.gpu == 3;
  EXPECT_TRUE(gpu3) << "the power-capped GPU is not evidence";
  EXPECT_THAT(f[0].action, HasSubstr("drain node-2"));
  EXPECT_THAT(f[0].action, ::testing::Not(HasSubstr("rebalance")));
  for (const RankSnapshot& r : e.Ranks("j")) {
    EXPECT_EQ(r.straggler, r.rank / 8 == 2) << r.rank;
  }
}

TEST(EngineCauseTest, SlowStageOnOneNodeIsNamedAndItsRanksMarked) {
  Engine e;
  EngineOptions o;
  o.max_finding_ranks = 3;
  Engine bounded(o);
  for (Engine* x : {&e, &bounded}) {
    JobDriver d(x, "pp", 2, 8);
    // 4 stages of 4 ranks; stage 3 (ranks 12-15, all on node-1) has 1.6x the work.
    d.split = [](int rank, int64_t) { return Split{rank / 4 == 3 ? 0.64 : 0.4, 0.0}; };
    d.decorate = [](StepEvent& s) {
      s.pp_stage = s.rank / 4;
      s.tp_rank = 0;
      s.dp_rank = s.rank % 4;
    };
    d.Run(60);
  }
  auto f = Of(e, FindingKind::kPipelineImbalance);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].stage, 3);
  EXPECT_EQ(f[0].node, "node-1");
  EXPECT_EQ(f[0].ranks, (std::vector<int>{12, 13, 14, 15}));
  EXPECT_EQ(f[0].cause, Cause::kMoreWork);
  EXPECT_THAT(f[0].action, HasSubstr("move layers off stage 3"));
  for (const RankSnapshot& r : e.Ranks("pp")) EXPECT_EQ(r.straggler, r.rank >= 12) << r.rank;
  auto fb = Of(bounded, FindingKind::kPipelineImbalance);
  ASSERT_EQ(fb.size(), 1u);
  EXPECT_EQ(fb[0].ranks, (std::vector<int>{12, 13, 14}));
}

TEST(EngineCauseTest, SlowStageAcrossNodesWithAThrottledGpu) {
  Engine e;
  JobDriver d(&e, "pp", 2, 8);
  // 2 stages of 8 ranks, stage 1 = ranks 4-11 spread over both nodes; rank 9's GPU is throttled.
  d.split = [](int rank, int64_t) { return Split{rank >= 4 && rank < 12 ? 0.64 : 0.4, 0.0}; };
  d.decorate = [](StepEvent& s) {
    s.pp_stage = s.rank >= 4 && s.rank < 12 ? 1 : 0;
    s.tp_rank = 0;
  };
  d.after_step = [&](int64_t) {
    AddGpus(&e, d, 2, 8, [](int n, int g, GpuSample& x) {
      if (n == 1 && g == 1) x.throttle_reasons = 0x8;
    });
  };
  d.Run(60);
  auto f = Of(e, FindingKind::kPipelineImbalance);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].stage, 1);
  EXPECT_EQ(f[0].node, "");
  EXPECT_EQ(f[0].evidence.nodes, (std::vector<std::string>{"node-0", "node-1"}));
  EXPECT_EQ(f[0].evidence.node_count, 2);
  ASSERT_FALSE(f[0].evidence.devices.empty());
  EXPECT_EQ(f[0].evidence.devices[0].node, "node-1");
  EXPECT_EQ(f[0].cause, Cause::kHardwareSlowdown);
  EXPECT_THAT(f[0].action, HasSubstr("node-1"));
}

TEST(EngineCauseTest, StallCausesAndRanks) {
  {
    Engine e;
    JobDriver d(&e, "j", 1, 4, 0.1);
    d.Run(50);
    EXPECT_FALSE(e.MarkRankExited("j", 3, 5003, d.now() + kSec).has_value());
    e.Advance(d.now() + 32 * kSec);
    auto f = Of(e, FindingKind::kStall);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].cause, Cause::kRankExited);
    EXPECT_THAT(f[0].action, HasSubstr("logs of rank 3"));
  }
  {
    Engine e;
    JobDriver d(&e, "j", 1, 4, 0.1);
    d.Run(50);
    for (int r = 0; r < 2; ++r) {  // ranks 2 and 3 fall silent a step behind
      StepEvent s;
      s.job = "j";
      s.world_size = 4;
      s.rank = r;
      s.step = 50;
      s.step_seconds = 0.52;
      s.received_unix_nanos = d.now() + kSec;
      ASSERT_OK(e.AddStep(s));
    }
    e.Advance(d.now() + 32 * kSec);
    auto f = Of(e, FindingKind::kStall);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].cause, Cause::kHang);
    EXPECT_EQ(f[0].ranks, (std::vector<int>{2, 3}));
    EXPECT_THAT(f[0].action, HasSubstr("py-spy dump"));
  }
}

TEST(EngineCauseTest, GpuFindingCauses) {
  EngineOptions o;
  o.underutil_window = absl::Seconds(5);
  Engine e(o);
  JobDriver d(&e, "j", 1, 4, 0.05);
  d.split = [](int, int64_t) { return Split{0.2, 0.3}; };  // data-bound
  d.Run(20);
  for (int i = 0; i <= 5; ++i) {  // within the window of the job's last step: it has work
    e.AddGpu(Reading("node-0", 2, d.now() + i * kSec, 0.3, {5002}));
    e.AddGpu(Reading("node-5", 0, d.now() + i * kSec, 0.0, {}));
  }
  auto u = Of(e, FindingKind::kUnderutilizedGpu);
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].cause, Cause::kDataLoading);
  EXPECT_EQ(u[0].ranks, std::vector<int>{2});
  auto idle = Of(e, FindingKind::kIdleGpu);
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(idle[0].cause, Cause::kNoWork);
  EXPECT_THAT(idle[0].action, HasSubstr("release"));
}

TEST(EngineCauseTest, ScalingAndRegressionNameTheLargestLoss) {
  Engine e;
  JobDriver small(&e, "j", 1, 8, /*comm_seconds=*/0.05);
  small.Run(64);
  JobDriver big(&e, "j", 2, 8, /*comm_seconds=*/0.6);  // twice the GPUs, far more exposed comm
  big.Run(64);
  auto f = Of(e, FindingKind::kScalingEfficiency);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].cause, Cause::kExposedComm);
  EXPECT_GT(f[0].evidence.comm_share_ratio.value_or(0),
            f[0].evidence.imbalance_share_ratio.value_or(1));
  EXPECT_THAT(f[0].action, HasSubstr("overlap communication"));

  Engine r;
  JobDriver d(&r, "j", 1, 8);
  d.split = [](int, int64_t step) { return Split{0.4, step >= 300 ? 0.3 : 0.02}; };  // data stall
  d.Run(340);
  auto reg = Of(r, FindingKind::kRegression);
  ASSERT_EQ(reg.size(), 1u);
  EXPECT_EQ(reg[0].cause, Cause::kDataLoading);
  EXPECT_THAT(reg[0].action, HasSubstr("data-loader workers"));
}

// A 2-rank job has no majority: the slow rank is the one the other waits for.

}  // namespace
}  // namespace stepwatch::analysis
