// The engine's what-ifs (JobSnapshot::whatif, analysis/window.cc) on hand-built steps whose
// answer is known; sim/whatif_check.h checks them against a simulation of real traces.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis {
namespace {

constexpr int64_t kT0 = 1'700'000'000'000'000'000;

struct RankSplit {
  double compute = 0.4, data = 0;
  int stage = -1;
};

// A synchronous job: each step ends at the slowest rank's busy time plus the collective; every
// rank reports its split and its wait (exposed communication).
std::optional<JobSnapshot> RunJob(const std::vector<RankSplit>& ranks, double collective,
                                  int steps = 32,
                                  std::function<double(int rank, int step)> wobble = nullptr) {
  Engine e;
  int64_t now = kT0;
  for (int s = 0; s < steps; ++s) {
    std::vector<RankSplit> rs = ranks;
    double max_busy = 0;
    for (size_t r = 0; r < rs.size(); ++r) {
      if (wobble) rs[r].compute *= wobble(static_cast<int>(r), s);
      max_busy = std::max(max_busy, rs[r].compute + rs[r].data);
    }
    const double step = max_busy + collective;
    now += static_cast<int64_t>(step * 1e9);
    for (size_t r = 0; r < rs.size(); ++r) {
      StepEvent x;
      x.job = "j";
      x.rank = static_cast<int>(r);
      x.world_size = static_cast<int>(rs.size());
      x.step = s;
      x.step_seconds = step;
      x.compute_seconds = rs[r].compute;
      x.data_seconds = rs[r].data;
      x.comm_seconds = step - rs[r].compute - rs[r].data;
      if (rs[r].stage >= 0) x.pp_stage = rs[r].stage;
      x.node = "n" + std::to_string(r);
      x.received_unix_nanos = now;
      EXPECT_OK(e.AddStep(x));
    }
    e.Advance(now);
  }
  return e.Job("j");
}

TEST(WhatIfTest, StragglersFixedEndsAtTheSlowestHealthyRankNotTheMedian) {
  // Healthy ranks 0.40-0.43, one at 0.60, collective 0.1: fixed, the step ends at 0.43 + 0.1.
  // (max - median busy would promise 0.70 / 0.515.)
  auto job = RunJob({{0.40}, {0.41}, {0.42}, {0.43}, {0.40}, {0.41}, {0.42}, {0.60}}, 0.1);
  ASSERT_TRUE(job.has_value());
  EXPECT_NEAR(job->whatif.stragglers, 0.70 / 0.53, 1e-6);
  EXPECT_EQ(job->whatif.stragglers_kind, WhatIfKind::kEstimate);
  EXPECT_NEAR(job->breakdown.imbalance, (0.60 - 0.415) / 0.70, 1e-6);  // unchanged
}

TEST(WhatIfTest, HealthyNoiseIsNotAStraggler) {
  auto job = RunJob({{0.40}, {0.41}, {0.405}, {0.415}}, 0.1);
  EXPECT_DOUBLE_EQ(job->whatif.stragglers, 1.0);
}

TEST(WhatIfTest, SlowHalfIsMeasuredAgainstTheFastHalf) {
  // Two classes of five (PAI job 4's shape): the median lies between them, the fast class is the
  // reference, and its spread (0.060-0.065) is healthy.
  std::vector<RankSplit> rs;
  for (int r = 0; r < 10; ++r) rs.push_back({r % 2 == 0 ? 0.060 + 0.00125 * (r / 2) : 0.23});
  auto job = RunJob(rs, 0.01);
  EXPECT_NEAR(job->whatif.stragglers, 0.24 / (0.065 + 0.01), 1e-6);
}

TEST(WhatIfTest, OneStepSpikeOfAHealthyRankIsNotAStraggler) {
  // Rank 2 takes 0.60 s in step 20 alone: that step ends at it whoever is fixed (a rank's level is
  // the median of its recent steps), so there is nothing to gain.
  auto job = RunJob({{0.4}, {0.4}, {0.4}, {0.4}, {0.4}, {0.4}}, 0.1, 32,
                    [](int r, int s) { return r == 2 && s == 20 ? 1.5 : 1.0; });
  EXPECT_DOUBLE_EQ(job->whatif.stragglers, 1.0);
  // A rank slow from step 20 on is one from its fifth slow step.
  job = RunJob({{0.4}, {0.4}, {0.4}, {0.4}, {0.4}, {0.4}}, 0.1, 32,
               [](int r, int s) { return r == 2 && s >= 20 ? 1.5 : 1.0; });
  EXPECT_NEAR(job->whatif.stragglers, (20 * 0.5 + 12 * 0.7) / (20 * 0.5 + 4 * 0.7 + 8 * 0.5), 1e-6);
}

TEST(WhatIfTest, TwoRanksGiveAnUpperBound) {
  auto job = RunJob({{0.40}, {0.50}}, 0.1);
  EXPECT_NEAR(job->whatif.stragglers, 0.60 / 0.50, 1e-6);
  EXPECT_EQ(job->whatif.stragglers_kind, WhatIfKind::kUpperBound);
  // One rank: nothing to compare with, nothing to gain.
  job = RunJob({{0.40}}, 0.1);
  EXPECT_DOUBLE_EQ(job->whatif.stragglers, 1.0);
  EXPECT_EQ(job->whatif.stragglers_kind, WhatIfKind::kEstimate);
}

TEST(WhatIfTest, OneRanksDataStallIsItsWholeWait) {
  // Rank 2 waits 0.15 s for input, the others 0.01 s: without data waits the step ends at the
  // compute (0.3) + collective, not 0.01 s (the median wait) earlier.
  auto job = RunJob({{0.3, 0.01}, {0.3, 0.01}, {0.3, 0.15}, {0.3, 0.01}}, 0.05);
  EXPECT_NEAR(job->whatif.data, 0.50 / 0.35, 1e-6);
  EXPECT_EQ(job->whatif.data_kind, WhatIfKind::kEstimate);
}

TEST(WhatIfTest, OverlapIsAnUpperBoundLimitedByCompute) {
  auto job = RunJob({{0.2}, {0.2}, {0.2}, {0.2}}, 1.0);
  EXPECT_NEAR(job->whatif.overlap, 1.2 / 1.0, 1e-6);
  EXPECT_EQ(job->whatif.overlap_kind, WhatIfKind::kUpperBound);
  EXPECT_DOUBLE_EQ(job->whatif.pipeline, 1.0);  // no pipeline stages
}

TEST(WhatIfTest, PipelineStagesBalancedIsAnUpperBound) {
  // Four stages, two ranks each; stage 2 computes 1.4x. Balanced: the slowest stage's compute
  // down to the mean of the stages' (1.1 x 0.4), at most the whole difference off the step.
  std::vector<RankSplit> rs;
  for (int r = 0; r < 8; ++r)
    rs.push_back({r % 4 == 2 ? 0.56 : 0.40, r % 4 == 0 ? 0.02 : 0, r % 4});
  auto job = RunJob(rs, 0.05);
  const double step = 0.56 + 0.05;
  EXPECT_NEAR(job->whatif.pipeline, step / (step - (0.56 - 0.44)), 1e-6);
  EXPECT_EQ(job->whatif.pipeline_kind, WhatIfKind::kUpperBound);
  // The slow stage is not a straggler: its peers are its own stage's ranks.
  EXPECT_DOUBLE_EQ(job->whatif.stragglers, 1.0);
  EXPECT_EQ(job->whatif.stragglers_kind, WhatIfKind::kUpperBound);
  // The first stage's input wait delays the whole pipeline: at least that much.
  EXPECT_NEAR(job->whatif.data, step / (step - 0.02), 1e-6);
  EXPECT_EQ(job->whatif.data_kind, WhatIfKind::kLowerBound);
}

TEST(WhatIfTest, KindNames) {
  EXPECT_STREQ(WhatIfKindName(WhatIfKind::kEstimate), "estimate");
  EXPECT_STREQ(WhatIfKindName(WhatIfKind::kLowerBound), "lower_bound");
  EXPECT_STREQ(WhatIfKindName(WhatIfKind::kUpperBound), "upper_bound");
  const WhatIf unknown;
  EXPECT_EQ(unknown.overlap_kind, WhatIfKind::kUpperBound);
  EXPECT_EQ(unknown.stragglers, 1.0);
}

}  // namespace
}  // namespace stepwatch::analysis
