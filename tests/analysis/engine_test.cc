#include "analysis/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kT0 = 1'700'000'000'000'000'000;
constexpr int64_t kSec = 1'000'000'000;

// Per-rank split of one step; the step time is the synchronous one: max busy + collective.
struct Split {
  double compute = 0.4;
  double data = 0.02;
};

// Drives an engine with a synchronous data-parallel job: every rank reports the same step time;
// the split shows who waited. `split(rank, step)` gives each rank's busy time.
class JobDriver {
 public:
  JobDriver(Engine* engine, std::string job, int nodes, int gpus, double comm_seconds = 0.1,
            uint64_t seed = 1)
      : engine_(engine),
        job_(std::move(job)),
        nodes_(nodes),
        gpus_(gpus),
        comm_s_(comm_seconds),
        rng_(seed) {}

  // Noise: coefficient of variation on each rank's compute and data.
  double noise_cv = 0.02;
  std::function<Split(int rank, int64_t step)> split = [](int, int64_t) { return Split{}; };
  bool report_split = true;       // data_seconds + compute_seconds + comm_seconds
  bool report_comm_only = false;  // step_seconds + comm_seconds
  int64_t samples = 16;
  std::function<void(StepEvent&)> decorate;

  int world() const { return nodes_ * gpus_; }
  int64_t now() const { return now_; }
  int64_t step() const { return step_; }

  // Runs `n` steps; returns false if AddStep failed.
  void Run(int64_t n) {
    std::normal_distribution<double> normal(0, 1);
    for (int64_t i = 0; i < n; ++i, ++step_) {
      std::vector<Split> s(world());
      double max_busy = 0;
      for (int r = 0; r < world(); ++r) {
        s[r] = split(r, step_);
        s[r].compute *= std::max(0.2, 1 + noise_cv * normal(rng_));
        s[r].data *= std::max(0.0, 1 + noise_cv * normal(rng_));
        max_busy = std::max(max_busy, s[r].compute + s[r].data);
      }
      const double step_seconds = max_busy + comm_s_;
      now_ += static_cast<int64_t>(step_seconds * kSec);
      for (int r = 0; r < world(); ++r) {
        StepEvent x;
        x.job = job_;
        x.rank = r;
        x.world_size = world();
        x.step = step_;
        x.step_seconds = step_seconds;
        const double wait = std::max(0.0, step_seconds - s[r].compute - s[r].data);
        if (report_split) {
          x.compute_seconds = s[r].compute;
          x.data_seconds = s[r].data;
          x.comm_seconds = wait;
        } else if (report_comm_only) {
          x.comm_seconds = wait;
        }
        if (samples > 0) x.samples = samples;
        x.local_rank = r % gpus_;
        x.node = "node-" + std::to_string(r / gpus_);
        x.pid = 5000 + r;
        x.received_unix_nanos = now_;
        if (decorate) decorate(x);
        absl::Status st = engine_->AddStep(x);
        ASSERT_OK(st);
      }
      engine_->Advance(now_);
      if (after_step) after_step(step_);
    }
  }
  std::function<void(int64_t)> after_step;

 private:
  Engine* engine_;
  std::string job_;
  int nodes_, gpus_;
  double comm_s_;
  std::mt19937_64 rng_;
  int64_t step_ = 0;
  int64_t now_ = kT0;
};

std::vector<Finding> Of(const Engine& e, FindingKind kind) {
  std::vector<Finding> out;
  for (const Finding& f : e.Findings()) {
    if (f.kind == kind) out.push_back(f);
  }
  return out;
}

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

TEST(EngineTest, StragglerTenPercentFlaggedAndClearedWithinTwentySteps) {
  Engine e;
  JobDriver d(&e, "j", 4, 8);
  d.noise_cv = 0.05;
  const int64_t onset = 200, end = 600;
  d.split = [&](int rank, int64_t step) {
    return Split{(rank == 13 && step >= onset && step < end) ? 0.44 * 1.1 / 1.0 : 0.4, 0.02};
  };
  int64_t flagged_at = -1, cleared_at = -1;
  d.after_step = [&](int64_t step) {
    bool flagged = false;
    for (const Finding& f : e.Findings()) {
      if (f.kind == FindingKind::kStraggler) {
        EXPECT_EQ(f.rank, 13) << f.summary;
        flagged = true;
      }
    }
    if (flagged && flagged_at < 0) flagged_at = step;
    if (!flagged && flagged_at >= 0 && step >= end && cleared_at < 0) cleared_at = step;
  };
  d.Run(800);
  ASSERT_GE(flagged_at, onset);
  EXPECT_LE(flagged_at - onset, 20);
  ASSERT_GE(cleared_at, end);
  EXPECT_LE(cleared_at - end, 20);
}

TEST(EngineTest, StragglerSummaryNamesComputeAndThrottling) {
  Engine e;
  JobDriver d(&e, "j", 2, 8);
  d.split = [](int rank, int64_t) { return Split{rank == 13 ? 0.4 * 1.31 : 0.4, 0.02}; };
  d.after_step = [&](int64_t step) {
    if (step % 10 != 0) return;
    for (int n = 0; n < 2; ++n) {
      for (int g = 0; g < 8; ++g) {
        GpuSample x;
        x.node = "node-" + std::to_string(n);
        x.index = g;
        x.sampled_unix_nanos = d.now();
        x.utilization_ratio = 0.95;
        bool hot = n == 1 && g == 5;
        x.sm_clock_mhz = hot ? 1410 : 1980;
        x.sm_clock_max_mhz = 1980;
        x.throttle_reasons = hot ? 0x40 : 0;
        x.pids = {static_cast<uint32_t>(5000 + n * 8 + g)};
        e.AddGpu(x);
      }
    }
  };
  d.decorate = [](StepEvent& s) { s.local_rank.reset(); };  // tie rank to GPU by pid only
  d.Run(300);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 13);
  EXPECT_EQ(f[0].node, "node-1");
  EXPECT_EQ(f[0].gpu, 5);
  EXPECT_TRUE(f[0].persistent);
  EXPECT_NEAR(f[0].evidence.compute_vs_median_ratio.value_or(0), 1.3, 0.02);
  ASSERT_EQ(f[0].evidence.devices.size(), 1u);
  EXPECT_EQ(f[0].evidence.devices[0].sm_clock_mhz, 1410);
  EXPECT_EQ(f[0].evidence.devices[0].sm_clock_max_mhz, 1980);
  EXPECT_TRUE(f[0].evidence.devices[0].throttle_reasons.has_value());
  // The rendering of those fields.
  EXPECT_THAT(f[0].summary, HasSubstr("rank 13 on node-1 GPU 5: compute +3"));
  EXPECT_THAT(f[0].summary, HasSubstr("SM clock 1410 of 1980 MHz, thermal throttling"));
  auto ranks = e.Ranks("j");
  EXPECT_TRUE(ranks[13].straggler);
  EXPECT_GT(ranks[13].busy_vs_median_ratio, 1.2);
}

// A CPU-only job (no GPU readings; the ranks send local_rank only): the summary names the rank's
// local rank as such, never as a GPU.
TEST(EngineTest, StragglerWithoutGpusNamesTheLocalRank) {
  Engine e;
  JobDriver d(&e, "cpu", 4, 8);
  d.split = [](int rank, int64_t) { return Split{rank == 13 ? 0.52 : 0.4, 0.02}; };
  d.Run(300);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 13);
  EXPECT_TRUE(f[0].gpu_is_local_rank);
  EXPECT_THAT(f[0].summary, HasSubstr("rank 13 on node-1 local rank 5: "));
  EXPECT_THAT(f[0].summary, Not(HasSubstr("GPU 5")));
}

TEST(EngineTest, TransientStragglerIsNotPersistent) {
  Engine e;
  JobDriver d(&e, "j", 1, 8);
  d.split = [](int rank, int64_t step) {
    return Split{rank == 2 && step >= 100 ? 0.6 : 0.4, 0.02};
  };
  d.Run(130);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].persistent);
  // The change point: the step after the statistic last stood at zero (noise may lift it a step
  // early).
  EXPECT_GE(f[0].since_step, 98);
  EXPECT_LE(f[0].since_step, 110);
}

TEST(EngineTest, DataLoadingStragglerIsAttributedToData) {
  Engine e;
  JobDriver d(&e, "j", 1, 8);
  d.split = [](int rank, int64_t) { return Split{0.4, rank == 6 ? 0.2 : 0.02}; };
  d.Run(60);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 6);
  EXPECT_EQ(f[0].cause, Cause::kDataLoading);
  // Rank 6 loads 0.2 s of data per step, its peers 0.02 s.
  EXPECT_NEAR(f[0].evidence.data_excess_seconds.value_or(0), 0.18, 0.03);
  EXPECT_THAT(f[0].summary, HasSubstr("data loading +"));
}

TEST(EngineTest, FastHealthyJobIsNotFlaggedThanksToAbsoluteMargin) {
  // 1.6 ms of busy time in a 9.5 ms step: relative noise is large, the absolute excess is not.
  Engine e;
  JobDriver d(&e, "ddp", 1, 4, /*comm_seconds=*/0.0079);
  d.noise_cv = 0.25;
  d.split = [](int rank, int64_t) { return Split{rank == 1 ? 0.0017 : 0.0015, 0.0001}; };
  d.Run(2000);
  EXPECT_TRUE(Of(e, FindingKind::kStraggler).empty());
}

TEST(EngineTest, WaitAsymmetryFindsStragglerFromStepAndCommOnly) {
  Engine e;
  JobDriver d(&e, "j", 1, 8);
  d.report_split = false;
  d.report_comm_only = true;
  d.split = [](int rank, int64_t) { return Split{rank == 4 ? 0.55 : 0.4, 0.02}; };
  d.Run(60);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 4);
}

TEST(EngineTest, StepOnlyReportsGiveNoStraggler) {
  Engine e;
  JobDriver d(&e, "j", 1, 8);
  d.report_split = false;
  d.split = [](int rank, int64_t) { return Split{rank == 4 ? 0.55 : 0.4, 0.02}; };
  d.Run(60);
  EXPECT_TRUE(Of(e, FindingKind::kStraggler).empty());  // all step times are equal
}

TEST(EngineTest, StepOnlyReportsUseSmActivityWhenGpusReportIt) {
  Engine e;
  JobDriver d(&e, "j", 1, 8);
  d.report_split = false;
  d.split = [](int rank, int64_t) { return Split{rank == 4 ? 0.55 : 0.4, 0.02}; };
  // The GPU of each rank reports its SM activity: compute share of the (common) step.
  d.after_step = [&](int64_t) {
    for (int g = 0; g < 8; ++g) {
      GpuSample x;
      x.node = "node-0";
      x.index = g;
      x.sampled_unix_nanos = d.now();
      x.utilization_ratio = 1.0;
      x.sm_activity_ratio = (g == 4 ? 0.55 : 0.4) / 0.67;
      e.AddGpu(x);
    }
  };
  d.Run(60);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 4);
}

TEST(EngineTest, WholeSlowNodeIsOneNodeFinding) {
  Engine e;
  JobDriver d(&e, "j", 4, 8);
  d.split = [](int rank, int64_t) { return Split{rank / 8 == 2 ? 0.5 : 0.4, 0.02}; };
  HostSample h;
  h.node = "node-2";
  h.cpu_utilization_ratio = 0.99;
  e.AddHost(h);
  d.Run(60);
  EXPECT_TRUE(Of(e, FindingKind::kStraggler).empty());
  auto f = Of(e, FindingKind::kSlowNode);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].node, "node-2");
  EXPECT_EQ(f[0].evidence.slow_rank_count, 8);
  EXPECT_EQ(f[0].evidence.node_rank_count, 8);
  ASSERT_FALSE(f[0].evidence.devices.empty());
  const DeviceEvidence& host = f[0].evidence.devices.back();
  EXPECT_EQ(host.gpu, -1);
  EXPECT_NEAR(host.host_cpu_ratio.value_or(0), 0.99, 1e-9);
  EXPECT_TRUE(host.host_cpu_median_ratio.has_value());
  EXPECT_THAT(f[0].summary, HasSubstr("host CPU 99%"));
}

TEST(EngineTest, PipelineStagesArePeersOnlyWithinAStage) {
  Engine e;
  JobDriver d(&e, "pp", 2, 8);
  // 4 stages of 4 ranks; stage 3 has 1.6x the work of the others.
  d.split = [](int rank, int64_t) { return Split{rank / 4 == 3 ? 0.64 : 0.4, 0.0}; };
  d.decorate = [](StepEvent& s) {
    s.pp_stage = s.rank / 4;
    s.tp_rank = 0;
    s.dp_rank = s.rank % 4;
  };
  d.Run(60);
  EXPECT_TRUE(Of(e, FindingKind::kStraggler).empty());
  auto f = Of(e, FindingKind::kPipelineImbalance);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].stage, 3);
  EXPECT_NEAR(f[0].evidence.stage_vs_median_ratio.value_or(0), 1.6, 0.05);
}

TEST(EngineTest, StragglerWithinAPipelineStage) {
  Engine e;
  JobDriver d(&e, "pp", 2, 8);
  d.split = [](int rank, int64_t) {
    double c = rank / 4 == 3 ? 0.6 : 0.4;
    return Split{rank == 9 ? c * 1.3 : c, 0.0};
  };
  d.decorate = [](StepEvent& s) {
    s.pp_stage = s.rank / 4;
    s.tp_rank = 0;
  };
  d.Run(60);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 9);
}

GpuSample Reading(const std::string& node, int index, int64_t t, double util,
                  std::vector<uint32_t> pids) {
  GpuSample x;
  x.node = node;
  x.index = index;
  x.sampled_unix_nanos = t;
  x.utilization_ratio = util;
  x.pids = std::move(pids);
  return x;
}

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
  o.underutil_window_nanos = 5 * kSec;
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
  o.underutil_window_nanos = 5 * kSec;
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
  o.underutil_window_nanos = 5 * kSec;
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
  o.step_grace_nanos = 1'000'000 * kSec;
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

// GPU readings for every rank of a JobDriver job: full clocks and busy unless `slow` says
// otherwise.
void AddGpus(Engine* e, const JobDriver& d, int nodes, int gpus,
             const std::function<void(int node, int gpu, GpuSample&)>& slow = nullptr) {
  for (int n = 0; n < nodes; ++n) {
    for (int g = 0; g < gpus; ++g) {
      GpuSample x = Reading("node-" + std::to_string(n), g, d.now(), 0.95,
                            {static_cast<uint32_t>(5000 + n * gpus + g)});
      x.sm_clock_mhz = 1980;
      x.sm_clock_max_mhz = 1980;
      x.throttle_reasons = 0;
      if (slow) slow(n, g, x);
      e->AddGpu(x);
    }
  }
}

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
  o.underutil_window_nanos = 5 * kSec;
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
TEST(EngineSmallJobTest, TwoRankStragglerFromWaitAsymmetry) {
  Engine e;
  JobDriver d(&e, "pair", 1, 2);
  d.noise_cv = 0.05;
  d.split = [](int rank, int64_t step) {
    return Split{rank == 1 && step >= 100 && step < 300 ? 0.4 * 1.32 : 0.4, 0.02};
  };
  d.Run(100);
  EXPECT_TRUE(Of(e, FindingKind::kStraggler).empty());
  auto ranks = e.Ranks("pair");
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_TRUE(ranks[0].comparable);
  d.Run(100);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 1);
  ranks = e.Ranks("pair");
  EXPECT_TRUE(ranks[1].straggler);
  EXPECT_FALSE(ranks[0].straggler);
  EXPECT_GT(ranks[1].busy_vs_median_ratio, 1.25);  // not "+0%": compared with the other rank
  EXPECT_LT(ranks[0].busy_vs_median_ratio, 0.8);
  d.Run(150);
  EXPECT_TRUE(Of(e, FindingKind::kStraggler).empty());  // cleared once balanced again
}

TEST(EngineSmallJobTest, TwoRanksPerPipelineGroupFindTheirStraggler) {
  Engine e;
  JobDriver d(&e, "pp", 1, 8);
  d.noise_cv = 0.05;
  // 4 stages of 2 data-parallel ranks; rank 5 (stage 2) is 30% slower than its partner, rank 4.
  d.split = [](int rank, int64_t) { return Split{rank == 5 ? 0.52 : 0.4, 0.02}; };
  d.decorate = [](StepEvent& s) {
    s.pp_stage = s.rank / 2;
    s.tp_rank = 0;
  };
  d.Run(80);
  auto f = Of(e, FindingKind::kStraggler);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 5);
  EXPECT_EQ(f[0].stage, 2);
}

TEST(EngineSmallJobTest, HealthyNoisyTwoRankJobIsNotFlagged) {
  Engine e;
  JobDriver d(&e, "pair", 1, 2, 0.1, /*seed=*/7);
  d.noise_cv = 0.05;
  d.Run(5000);
  EXPECT_TRUE(e.Findings().empty());
}

TEST(EngineSmallJobTest, OneRankAndStepOnlyRanksAreNotComparable) {
  Engine e;
  JobDriver one(&e, "one", 1, 1);
  one.Run(40);
  auto r = e.Ranks("one");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].comparable);
  JobDriver step_only(&e, "step-only", 1, 4);
  step_only.report_split = false;
  step_only.Run(40);
  for (const RankSnapshot& x : e.Ranks("step-only")) EXPECT_FALSE(x.comparable);
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
