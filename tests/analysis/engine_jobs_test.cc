// Job-level findings through the whole engine: underutilized and idle GPUs, scaling efficiency,
// regressions, stalls and finished jobs.
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

TEST(EngineTest, UnderutilizedGpuFlaggedWithinWindowWithDataCause) {
  Engine e;  // default window 30 s
  JobDriver d(&e, "j", 1, 4, 0.05);
  d.split = [](int, int64_t) { return Split{0.2, 0.3}; };  // data-bound
  d.Run(20);
  int64_t first_below = -1, flagged_at = -1;
  for (int i = 0; i < 60 && flagged_at < 0; ++i) {
    int64_t t = d.now() + i * kSec;
    e.AddGpu(Reading("node-0", 2, t, 0.3, {5002}));
    if (first_below < 0) first_below = t;
    e.Advance(t);
    if (!Of(e, FindingKind::kUnderutilizedGpu).empty()) flagged_at = t;
  }
  ASSERT_GE(flagged_at, 0);
  EXPECT_LE(flagged_at - first_below, 30 * kSec + 5 * kSec);
  EXPECT_GE(flagged_at - first_below, 30 * kSec);
  auto f = Of(e, FindingKind::kUnderutilizedGpu);
  EXPECT_EQ(f[0].job, "j");
  EXPECT_EQ(f[0].rank, 2);
  EXPECT_EQ(f[0].cause, Cause::kDataLoading);
  EXPECT_GE(f[0].evidence.data_share_ratio.value_or(0), EngineOptions().data_bound_share);
  EXPECT_GE(f[0].evidence.below_threshold_seconds.value_or(0), 30);
  e.AddGpu(Reading("node-0", 2, flagged_at + kSec, 0.9, {5002}));
  EXPECT_TRUE(Of(e, FindingKind::kUnderutilizedGpu).empty());
}

TEST(EngineTest, UnderutilizationCauses) {
  EngineOptions o;
  o.underutil_window = absl::Seconds(5);
  {
    Engine e(o);
    JobDriver d(&e, "j", 1, 4, 0.05);
    d.Run(20);
    HostSample h;
    h.node = "node-0";
    h.cpu_utilization_ratio = 0.97;
    e.AddHost(h);
    for (int i = 0; i <= 6; ++i) e.AddGpu(Reading("node-0", 1, d.now() + i * kSec, 0.2, {5001}));
    auto f = Of(e, FindingKind::kUnderutilizedGpu);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].cause, Cause::kHostCpu);
    ASSERT_EQ(f[0].evidence.devices.size(), 1u);
    EXPECT_NEAR(f[0].evidence.devices[0].host_cpu_ratio.value_or(0), 0.97, 1e-9);
    EXPECT_THAT(f[0].summary, HasSubstr("host CPU bound (CPU 97%)"));
  }
  {
    Engine e(o);
    JobDriver d(&e, "j", 1, 4, 0.05);
    d.Run(20);
    for (int i = 0; i <= 6; ++i) {
      GpuSample x = Reading("node-0", 1, d.now() + i * kSec, 0.9, {5001});
      x.sm_activity_ratio = 0.3;
      x.dram_bandwidth_ratio = 0.85;
      e.AddGpu(x);
    }
    auto f = Of(e, FindingKind::kUnderutilizedGpu);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f[0].cause, Cause::kMemoryBandwidth);
    ASSERT_EQ(f[0].evidence.devices.size(), 1u);
    EXPECT_NEAR(f[0].evidence.devices[0].dram_bandwidth_ratio.value_or(0), 0.85, 1e-9);
    EXPECT_NEAR(f[0].evidence.devices[0].sm_activity_ratio.value_or(0), 0.3, 1e-9);
  }
  {
    Engine e(o);
    JobDriver d(&e, "j", 1, 4, /*comm_seconds=*/0.5);
    d.after_step = [&](int64_t) {
      GpuSample x = Reading("node-0", 1, d.now(), 0.9, {5001});
      x.sm_activity_ratio = 0.3;  // NVML utilization counts spinning collectives; SM activity not
      e.AddGpu(x);
    };
    d.Run(20);
    auto f = Of(e, FindingKind::kUnderutilizedGpu);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_THAT(f[0].cause, ::testing::AnyOf(Cause::kExposedComm, Cause::kImbalance));
    EXPECT_GE(f[0].evidence.comm_share_ratio.value_or(0) +
                  f[0].evidence.imbalance_share_ratio.value_or(0),
              EngineOptions().comm_bound_share)
        << f[0].summary;
  }
}

TEST(EngineTest, GpuWithoutProcessIsIdleCapacityNotAJobProblem) {
  EngineOptions o;
  o.underutil_window = absl::Seconds(5);
  Engine e(o);
  for (int i = 0; i <= 6; ++i) {
    e.AddGpu(Reading("node-9", 7, kT0 + i * kSec, 0.0, {}));
    e.AddGpu(Reading("node-9", 6, kT0 + i * kSec, 0.0, {4242}));  // someone else's process
  }
  auto all = e.Findings();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, FindingKind::kIdleGpu);
  EXPECT_EQ(all[0].gpu, 7);
  EXPECT_EQ(all[0].job, "");
  e.RemoveNode("node-9");
  EXPECT_TRUE(e.Findings().empty());
}

TEST(EngineTest, ScalingEfficiencyEightAtEightThenSixteenAtTen) {
  Engine e;
  {
    JobDriver d(&e, "resnet", 1, 8, 0.0);
    d.noise_cv = 0;
    d.split = [](int, int64_t) { return Split{1.0, 0.0}; };
    d.Run(64);  // 8 GPUs: 8 steps' worth of samples per second = 8x one GPU
  }
  {
    // 16 GPUs at 10x: each step takes 16/10 = 1.6 s.
    JobDriver d(&e, "resnet", 2, 8, 0.0);
    d.noise_cv = 0;
    d.split = [](int, int64_t) { return Split{1.6, 0.0}; };
    d.Run(64);
  }
  auto job = e.Job("resnet");
  ASSERT_TRUE(job->scaling_efficiency_ratio.has_value());
  EXPECT_NEAR(*job->scaling_efficiency_ratio, 0.625, 1e-9);
  auto f = Of(e, FindingKind::kScalingEfficiency);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NEAR(f[0].evidence.scaling_efficiency_ratio.value_or(0), 0.625, 1e-9);
  EXPECT_EQ(f[0].evidence.world_size, 16);

  // The history survives a restart.
  Engine restarted;
  ASSERT_OK(restarted.LoadScalingHistory(e.SerializeScalingHistory()));
  EXPECT_EQ(restarted.SerializeScalingHistory(), e.SerializeScalingHistory());
  JobDriver d(&restarted, "resnet", 2, 8, 0.0);
  d.noise_cv = 0;
  d.split = [](int, int64_t) { return Split{1.6, 0.0}; };
  d.Run(64);
  EXPECT_NEAR(*restarted.Job("resnet")->scaling_efficiency_ratio, 0.625, 1e-9);
  EXPECT_FALSE(restarted.LoadScalingHistory("garbage").ok());
  EXPECT_FALSE(
      restarted.LoadScalingHistory("stepwatch-scaling-history v1\nx\tnot-a-number\t1\n").ok());
}

TEST(EngineTest, GoodScalingIsNotAFinding) {
  Engine e;
  {
    JobDriver d(&e, "j", 1, 8, 0.0);
    d.Run(64);
  }
  JobDriver d(&e, "j", 2, 8, 0.0);
  d.split = [](int, int64_t) { return Split{0.44, 0.02}; };  // 0.46 vs 0.42: ~91%
  d.Run(64);
  EXPECT_GT(*e.Job("j")->scaling_efficiency_ratio, 0.85);
  EXPECT_TRUE(Of(e, FindingKind::kScalingEfficiency).empty());
}

TEST(EngineTest, RegressionNamesTheStepAndClears) {
  Engine e;
  JobDriver d(&e, "j", 1, 8);
  d.split = [](int, int64_t step) {
    return Split{step >= 300 && step < 500 ? 0.4 * 1.2 : 0.4, 0.02};
  };
  int64_t seen_at = -1;
  d.after_step = [&](int64_t step) {
    if (seen_at < 0 && !Of(e, FindingKind::kRegression).empty()) seen_at = step;
  };
  d.Run(400);
  auto f = Of(e, FindingKind::kRegression);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NEAR(f[0].since_step, 300, 2);
  EXPECT_GT(f[0].evidence.step_vs_baseline_ratio.value_or(0),
            1 + EngineOptions().regression_threshold);
  EXPECT_NEAR(
      f[0].evidence.step_vs_baseline_ratio.value_or(0),
      f[0].evidence.step_seconds.value_or(0) / f[0].evidence.baseline_step_seconds.value_or(1),
      1e-9);
  EXPECT_LE(seen_at - 300, 16);
  d.Run(200);
  EXPECT_TRUE(Of(e, FindingKind::kRegression).empty());
  EXPECT_TRUE(Of(e, FindingKind::kStraggler).empty());
}

TEST(EngineTest, SmallDriftIsNotARegression) {
  Engine e;
  JobDriver d(&e, "j", 1, 8);
  d.noise_cv = 0.05;
  d.split = [](int, int64_t step) { return Split{step >= 300 ? 0.4 * 1.04 : 0.4, 0.02}; };
  d.Run(1000);
  EXPECT_TRUE(e.Findings().empty());
}

TEST(EngineTest, StallNamesSilentAndWaitingRanks) {
  Engine e;
  JobDriver d(&e, "j", 1, 4, 0.1);
  d.Run(50);  // 0.52 s steps: the 30 s floor applies
  // Ranks 0-2 report step 50; rank 3 never does.
  for (int r = 0; r < 3; ++r) {
    StepEvent s;
    s.job = "j";
    s.world_size = 4;
    s.rank = r;
    s.step = 50;
    s.step_seconds = 0.52;
    s.received_unix_nanos = d.now() + kSec;
    ASSERT_OK(e.AddStep(s));
  }
  e.Advance(d.now() + 30 * kSec);
  EXPECT_TRUE(Of(e, FindingKind::kStall).empty());
  e.Advance(d.now() + 32 * kSec);
  auto f = Of(e, FindingKind::kStall);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].since_step, 50);
  EXPECT_EQ(f[0].severity, Severity::kCritical);
  EXPECT_EQ(f[0].ranks, std::vector<int>{3});
  EXPECT_EQ(f[0].evidence.silent_rank_count, 1);
  EXPECT_EQ(f[0].evidence.waiting_ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_THAT(f[0].summary, HasSubstr("silent ranks (behind): 3; waiting ranks: 0,1,2"));
  StepEvent s;
  s.job = "j";
  s.world_size = 4;
  s.rank = 3;
  s.step = 51;
  s.step_seconds = 0.52;
  s.received_unix_nanos = d.now() + 40 * kSec;
  ASSERT_OK(e.AddStep(s));
  EXPECT_TRUE(Of(e, FindingKind::kStall).empty());
}

TEST(EngineTest, JobWhoseRanksAllExitedFinishesInsteadOfStalling) {
  EngineOptions o;
  o.underutil_window = absl::Seconds(5);
  Engine e(o);
  JobDriver d(&e, "j", 1, 4, 0.1);
  d.Run(50);
  // The job ends: its GPUs go quiet while the processes wind down.
  int64_t t = d.now();
  for (int i = 0; i <= 6; ++i, t += kSec) {
    for (int g = 0; g < 4; ++g) {
      e.AddGpu(Reading("node-0", g, t, 0.0, {static_cast<uint32_t>(5000 + g)}));
    }
    e.Advance(t);
  }
  ASSERT_EQ(Of(e, FindingKind::kUnderutilizedGpu).size(), 4u);  // "no work" while it lingers
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(e.MarkRankExited("j", r, 5000 + r, t).has_value());
    EXPECT_TRUE(e.Job("j").has_value());
  }
  std::optional<FinishedJob> done = e.MarkRankExited("j", 3, 5003, t);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->job, "j");
  EXPECT_EQ(done->ranks, 4);
  EXPECT_EQ(done->last_step, 49);
  EXPECT_FALSE(e.Job("j").has_value());
  EXPECT_TRUE(e.Jobs().empty());
  EXPECT_TRUE(e.Ranks("j").empty());
  // Long past the 30 s stall floor: no stall, and the GPUs (their processes gone) are idle
  // capacity, not a job's problem.
  for (int i = 0; i < 60; ++i, t += kSec) {
    for (int g = 0; g < 4; ++g) e.AddGpu(Reading("node-0", g, t, 0.0, {}));
    e.Advance(t);
  }
  EXPECT_TRUE(Of(e, FindingKind::kStall).empty());
  EXPECT_TRUE(Of(e, FindingKind::kUnderutilizedGpu).empty());
  for (const Finding& f : e.Findings()) EXPECT_EQ(f.job, "") << f.summary;
  // Exits of a job that is gone (or never was) change nothing.
  EXPECT_FALSE(e.MarkRankExited("j", 3, 5003, t).has_value());
  EXPECT_FALSE(e.MarkRankExited("other", 0, 1, t).has_value());
}

// A job that moved to other collectors: each node's agent releases its ranks; the job is kept
// while a node has not released it, forgotten at the last release, and never stalls here.
TEST(EngineTest, ReleasedRanksLeaveNoStallAndTheLastReleaseForgetsTheJob) {
  Engine e;
  JobDriver d(&e, "j", 2, 4, 0.1);
  d.Run(50);
  EXPECT_FALSE(e.ReleaseRanksOn("j", "node-9", d.now()).has_value());  // no ranks there
  EXPECT_FALSE(e.ReleaseRanksOn("other", "node-0", d.now()).has_value());
  EXPECT_FALSE(e.ReleaseRanksOn("j", "node-0", d.now()).has_value());
  ASSERT_TRUE(e.Job("j").has_value());
  std::optional<FinishedJob> done = e.ReleaseRanksOn("j", "node-1", d.now());
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->job, "j");
  EXPECT_EQ(done->ranks, 8);
  EXPECT_FALSE(e.Job("j").has_value());
  e.Advance(d.now() + 120 * kSec);
  EXPECT_TRUE(Of(e, FindingKind::kStall).empty());
}

TEST(EngineTest, StallNamesRanksWhoseProcessesExited) {
  Engine e;
  JobDriver d(&e, "j", 1, 4, 0.1);
  d.Run(50);
  EXPECT_FALSE(e.MarkRankExited("j", 3, 5003, d.now() + kSec).has_value());
  e.Advance(d.now() + 32 * kSec);
  auto f = Of(e, FindingKind::kStall);
  ASSERT_EQ(f.size(), 1u) << "ranks 0-2 still run: a hang, not a finished job";
  EXPECT_EQ(f[0].evidence.exited_ranks, std::vector<int>{3});
  EXPECT_THAT(f[0].summary, HasSubstr("; rank 3 exited"));
  EXPECT_FALSE(e.MarkRankExited("j", 1, 5001, d.now() + 33 * kSec).has_value());
  f = Of(e, FindingKind::kStall);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_THAT(f[0].summary, HasSubstr("; ranks 1,3 exited"));
  EXPECT_TRUE(e.Job("j").has_value());
}

TEST(EngineTest, RestartedRankKeepsItsJobRunning) {
  Engine e;
  JobDriver d(&e, "j", 1, 2, 0.1);
  d.Run(20);
  // The exit of some other process that once sent for rank 0 is not rank 0's exit.
  EXPECT_FALSE(e.MarkRankExited("j", 0, 4242, d.now()).has_value());
  EXPECT_FALSE(e.MarkRankExited("j", 1, 5001, d.now()).has_value());
  EXPECT_TRUE(e.Job("j").has_value());
  // Rank 1 comes back (restarted) and reports again: it runs.
  StepEvent s;
  s.job = "j";
  s.world_size = 2;
  s.rank = 1;
  s.step = 20;
  s.step_seconds = 0.52;
  s.pid = 6001;
  s.received_unix_nanos = d.now() + kSec;
  ASSERT_OK(e.AddStep(s));
  EXPECT_FALSE(e.MarkRankExited("j", 0, 5000, d.now() + 2 * kSec).has_value());
  EXPECT_TRUE(e.Job("j").has_value());
  // The old process of rank 1 again: ignored; the new one ends the job.
  EXPECT_FALSE(e.MarkRankExited("j", 1, 5001, d.now() + 3 * kSec).has_value());
  std::optional<FinishedJob> done = e.MarkRankExited("j", 1, 6001, d.now() + 3 * kSec);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->ranks, 2);
  EXPECT_EQ(done->last_step, 20);
}

TEST(EngineTest, StallLimitScalesWithSlowSteps) {
  Engine e;
  JobDriver d(&e, "slow", 1, 2, 0.0);
  d.noise_cv = 0;
  d.split = [](int, int64_t) { return Split{5.0, 0.0}; };  // 5 s steps: 50 s limit
  d.Run(20);
  e.Advance(d.now() + 45 * kSec);
  EXPECT_TRUE(Of(e, FindingKind::kStall).empty());
  e.Advance(d.now() + 51 * kSec);
  ASSERT_EQ(Of(e, FindingKind::kStall).size(), 1u);
  const Evidence ev = Of(e, FindingKind::kStall)[0].evidence;
  EXPECT_EQ(ev.silent_rank_count, 0);
  EXPECT_EQ(ev.waiting_rank_count, 2);
  EXPECT_DOUBLE_EQ(ev.stall_limit_seconds.value_or(0), 50);
  EXPECT_DOUBLE_EQ(ev.median_step_seconds.value_or(0), 5);
  EXPECT_THAT(Of(e, FindingKind::kStall)[0].summary, HasSubstr("all 2 ranks silent"));
}

}  // namespace
}  // namespace stepwatch::analysis
