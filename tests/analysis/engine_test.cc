// The engine itself: steps, limits, completion, determinism, nodes, honest numbers.
#include "analysis/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/time/time.h"
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

TEST(EngineTest, JobBasics) {
  Engine e;
  JobDriver d(&e, "bert", 2, 4, /*comm_seconds=*/0.1);
  d.noise_cv = 0;
  d.Run(40);
  auto job = e.Job("bert");
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->world_size, 8);
  EXPECT_EQ(job->ranks_reporting, 8);
  EXPECT_EQ(job->last_step, 39);
  EXPECT_NEAR(job->median_step_seconds, 0.52, 1e-6);
  EXPECT_NEAR(job->steps_per_second, 1 / 0.52, 1e-6);
  EXPECT_NEAR(job->samples_per_second, 8 * 16 / 0.52, 1e-3);
  EXPECT_NEAR(job->efficiency_ratio, 0.42 / 0.52, 1e-3);
  EXPECT_NEAR(job->breakdown.compute, 0.40 / 0.52, 1e-3);
  EXPECT_NEAR(job->breakdown.data, 0.02 / 0.52, 1e-3);
  EXPECT_NEAR(job->breakdown.comm, 0.10 / 0.52, 1e-3);
  EXPECT_NEAR(job->breakdown.imbalance, 0, 1e-6);
  EXPECT_NEAR(job->whatif.overlap, 0.52 / 0.42, 1e-3);
  EXPECT_NEAR(job->whatif.data, 0.52 / 0.50, 1e-3);
  EXPECT_NEAR(job->whatif.stragglers, 1, 1e-6);
  EXPECT_EQ(e.Jobs().size(), 1u);
  auto ranks = e.Ranks("bert");
  ASSERT_EQ(ranks.size(), 8u);
  EXPECT_EQ(ranks[5].node, "node-1");
  EXPECT_EQ(ranks[5].gpu, 1);
  EXPECT_NEAR(ranks[5].compute_seconds, 0.4, 1e-6);
  EXPECT_NEAR(ranks[5].comm_seconds, 0.1, 1e-6);
  EXPECT_TRUE(e.Findings().empty());
  e.RemoveJob("bert");
  EXPECT_FALSE(e.Job("bert").has_value());
}

TEST(EngineTest, RejectsBadSamplesAndEnforcesLimits) {
  EngineOptions o;
  o.max_jobs = 1;
  o.max_ranks_per_job = 4;
  Engine e(o);
  StepEvent s;
  s.job = "a";
  s.world_size = 2;
  s.rank = 0;
  s.step_seconds = 1;
  EXPECT_OK(e.AddStep(s));
  StepEvent bad = s;
  bad.rank = 2;
  EXPECT_EQ(e.AddStep(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.step_seconds = std::nan("");
  EXPECT_EQ(e.AddStep(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.comm_seconds = -1;
  EXPECT_EQ(e.AddStep(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.job = "";
  EXPECT_EQ(e.AddStep(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.job = "b";
  EXPECT_EQ(e.AddStep(bad).code(), absl::StatusCode::kResourceExhausted);
  bad = s;
  bad.world_size = 5;
  EXPECT_EQ(e.AddStep(bad).code(), absl::StatusCode::kResourceExhausted);
}

// Found by fuzz_collector_apply: a batch not from an agent carried pp_stage -268435537, which
// reached the peer-group key as a left shift of a negative value.
TEST(EngineTest, RejectsNegativeTopologyIndices) {
  Engine e;
  StepEvent s;
  s.job = "a";
  s.world_size = 2;
  s.rank = 0;
  s.step_seconds = 1;
  for (std::optional<int> StepEvent::*field :
       {&StepEvent::local_rank, &StepEvent::gpu, &StepEvent::dp_rank, &StepEvent::pp_stage,
        &StepEvent::tp_rank}) {
    StepEvent bad = s;
    bad.*field = -1;
    EXPECT_EQ(e.AddStep(bad).code(), absl::StatusCode::kInvalidArgument);
  }
  s.pp_stage = 0;
  s.tp_rank = 0;
  EXPECT_OK(e.AddStep(s));
  EXPECT_EQ(e.Job("a")->ranks_reporting, 1);
}

TEST(EngineTest, StepCompletesAfterGraceWhenARankIsMissing) {
  Engine e;
  for (int r = 0; r < 3; ++r) {  // rank 3 of 4 never reports
    StepEvent s;
    s.job = "j";
    s.world_size = 4;
    s.rank = r;
    s.step = 7;
    s.step_seconds = 2;
    s.received_unix_nanos = kT0;
    ASSERT_OK(e.AddStep(s));
  }
  EXPECT_EQ(e.Job("j")->median_step_seconds, 0);  // still pending
  e.Advance(kT0 + 4 * kSec);
  EXPECT_EQ(e.Job("j")->median_step_seconds, 0);
  e.Advance(kT0 + 5 * kSec);
  EXPECT_EQ(e.Job("j")->median_step_seconds, 2);
  EXPECT_EQ(e.Job("j")->last_step, 7);
  EXPECT_EQ(e.Job("j")->last_complete_step, 7);
  EXPECT_EQ(e.Job("j")->incomplete_steps, 1);
  EXPECT_EQ(e.Job("j")->late_samples, 0);
  // The missing rank's report after its step was analysed is left out, and counted.
  StepEvent late;
  late.job = "j";
  late.world_size = 4;
  late.rank = 3;
  late.step = 7;
  late.step_seconds = 9;
  late.received_unix_nanos = kT0 + 6 * kSec;
  ASSERT_OK(e.AddStep(late));
  EXPECT_EQ(e.Job("j")->late_samples, 1);
  EXPECT_EQ(e.Job("j")->median_step_seconds, 2);
}

TEST(EngineTest, SparseStepsAndDuplicatesAreHandled) {
  Engine e;
  for (int64_t step : {0, 10, 10, 20, 30}) {
    for (int r = 0; r < 2; ++r) {
      StepEvent s;
      s.job = "j";
      s.world_size = 2;
      s.rank = r;
      s.step = step;
      s.step_seconds = 1;
      s.received_unix_nanos = kT0 + step * kSec;
      ASSERT_OK(e.AddStep(s));
    }
  }
  auto job = e.Job("j");
  EXPECT_EQ(job->last_step, 30);
  EXPECT_EQ(job->median_step_seconds, 1);
  EXPECT_EQ(e.Ranks("j")[0].busy_seconds, 1);
}

// "Should we overlap communication with compute, or rebalance the load?"
TEST(EngineTest, WhatIfOverlapVsRebalanceComeOutTheRightWayRound) {
  {
    Engine e;  // communication heavy, balanced: overlap wins
    JobDriver d(&e, "comm-heavy", 2, 4, /*comm_seconds=*/0.3);
    d.Run(64);
    auto job = e.Job("comm-heavy");
    EXPECT_GT(job->whatif.overlap, 1.4);
    EXPECT_LT(job->whatif.stragglers, 1.1);
    EXPECT_GT(job->whatif.overlap, job->whatif.stragglers);
    EXPECT_GT(job->breakdown.comm, job->breakdown.imbalance);
  }
  {
    Engine e;  // imbalanced, little communication: rebalancing wins
    JobDriver d(&e, "imbalanced", 2, 4, /*comm_seconds=*/0.02);
    d.split = [](int rank, int64_t) { return Split{rank == 3 ? 0.7 : 0.4, 0.02}; };
    d.Run(64);
    auto job = e.Job("imbalanced");
    EXPECT_GT(job->whatif.stragglers, 1.4);
    EXPECT_LT(job->whatif.overlap, 1.1);
    EXPECT_GT(job->whatif.stragglers, job->whatif.overlap);
    EXPECT_GT(job->breakdown.imbalance, job->breakdown.comm);
  }
}

TEST(EngineTest, DeterministicAcrossRuns) {
  auto run = []() {
    Engine e;
    JobDriver d(&e, "j", 2, 8, 0.1, /*seed=*/42);
    d.noise_cv = 0.05;
    d.split = [](int rank, int64_t step) { return Split{rank == 3 && step > 100 ? 0.5 : 0.4}; };
    d.Run(300);
    std::string out;
    for (const Finding& f : e.Findings()) out += f.summary + "|" + std::to_string(f.since_step);
    return out;
  };
  std::string a = run();
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, run());
}

TEST(EngineTest, PendingStepsAreBounded) {
  EngineOptions o;
  o.max_pending_steps = 8;
  o.step_grace = absl::Seconds(1'000'000);
  Engine e(o);
  for (int64_t step = 0; step < 100; ++step) {  // rank 1 of 2 never reports
    StepEvent s;
    s.job = "j";
    s.world_size = 2;
    s.step = step;
    s.step_seconds = 1;
    s.received_unix_nanos = kT0 + step * kSec;
    ASSERT_OK(e.AddStep(s));
  }
  EXPECT_EQ(e.Job("j")->median_step_seconds, 1);  // old steps were completed with what they had
  EXPECT_EQ(e.Job("j")->incomplete_steps, 100 - 8);
}

TEST(EngineTest, HugeWorldSizeCostsOnlyTheRanksThatReport) {
  Engine e;
  StepEvent s;
  s.job = "big";
  s.world_size = 100000;
  s.rank = 99999;
  s.step_seconds = 1;
  s.node = "node-a";
  ASSERT_OK(e.AddStep(s));
  auto ranks = e.Ranks("big");
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0].rank, 99999);
  EXPECT_EQ(e.Job("big")->ranks_reporting, 1);
}

TEST(EngineTest, RemoveNodeForgetsItsRanksAndGpus) {
  Engine e;
  JobDriver d(&e, "j", 2, 4);
  d.split = [](int rank, int64_t) { return Split{rank == 5 ? 0.6 : 0.4, 0.02}; };
  d.Run(40);
  ASSERT_EQ(Of(e, FindingKind::kStraggler).size(), 1u);
  e.RemoveNode("node-1");
  EXPECT_TRUE(Of(e, FindingKind::kStraggler).empty());
  EXPECT_EQ(e.Ranks("j").size(), 4u);
  EXPECT_EQ(e.Job("j")->ranks_reporting, 4);
}

TEST(EngineTest, DecodesThrottleReasons) {
  EXPECT_THAT(DecodeThrottleReasons(0x60), ::testing::ElementsAre("thermal throttling"));
  EXPECT_THAT(DecodeThrottleReasons(0x4 | 0x8),
              ::testing::ElementsAre("power capping", "hardware slowdown"));
  EXPECT_TRUE(DecodeThrottleReasons(0x1).empty());
  EXPECT_STREQ(FindingKindName(FindingKind::kSlowNode), "slow_node");
  EXPECT_STREQ(SeverityName(Severity::kCritical), "critical");
}

TEST(EngineHonestNumbersTest, StepOnlyJobHasUnknownSplitUntilSplitsArrive) {
  Engine e;
  JobDriver d(&e, "j", 1, 4);
  d.report_split = false;
  d.Run(40);
  auto job = e.Job("j");
  ASSERT_TRUE(job.has_value());
  EXPECT_FALSE(job->split_known);
  EXPECT_GT(job->median_step_seconds, 0);  // step time itself is known
  EXPECT_EQ(job->efficiency_ratio, 0);
  EXPECT_EQ(job->breakdown.compute, 0);
  EXPECT_EQ(job->breakdown.other, TimeBreakdown().other);
  EXPECT_EQ(job->whatif.overlap, WhatIf().overlap);
  EXPECT_EQ(job->whatif.stragglers, WhatIf().stragglers);
  d.report_split = true;
  d.Run(10);
  job = e.Job("j");
  EXPECT_TRUE(job->split_known);
  EXPECT_GT(job->efficiency_ratio, 0.5);
}

TEST(EngineHonestNumbersTest, OverlapCannotHideMoreThanTheCompute) {
  Engine e;
  // 0.2 s of compute, 1.0 s of exposed communication: overlap hides at most 0.2 s.
  JobDriver d(&e, "j", 1, 4, /*comm_seconds=*/1.0);
  d.noise_cv = 0;
  d.split = [](int, int64_t) { return Split{0.2, 0.0}; };
  d.Run(40);
  auto job = e.Job("j");
  ASSERT_TRUE(job.has_value());
  EXPECT_NEAR(job->whatif.overlap, 1.2 / 1.0, 1e-3);
  EXPECT_NEAR(job->breakdown.comm, 1.0 / 1.2, 1e-3);  // the breakdown still shows all of it
}

}  // namespace
}  // namespace stepwatch::analysis
