#include "sim/tracesim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <numeric>

#include "tests/testing/status_matchers.h"

namespace stepwatch::sim {
namespace {

double Total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// A synchronous data-parallel step: busy per rank, the collective's own time; every rank's
// exposed communication is its wait for the slowest plus the collective.
std::vector<RankStep> DpStep(const std::vector<double>& compute, double collective,
                             const std::vector<double>& data = {}, double hidden = -1) {
  std::vector<RankStep> rs(compute.size());
  double max_arrival = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].compute = compute[i];
    rs[i].data = data.empty() ? 0 : data[i];
    max_arrival = std::max(max_arrival, rs[i].arrival());
  }
  for (RankStep& r : rs) {
    r.exposed_comm = max_arrival - r.arrival() + collective;
    r.comm = hidden < 0 ? -1 : r.exposed_comm + hidden;
    r.step = max_arrival + collective;
  }
  return rs;
}

DpTrace Repeat(const std::vector<RankStep>& step, int n) {
  DpTrace t;
  t.name = "t";
  t.ranks = t.job_world_size = static_cast<int>(step.size());
  for (int i = 0; i < n; ++i) {
    t.steps.push_back(i);
    t.rank_steps.push_back(step);
  }
  return t;
}

TEST(TraceSimTest, OneFOneBOfEqualStagesIsTheTextbookMakespan) {
  // P stages, M micro-batches, forward F and backward B: (M + P - 1) x (F + B).
  const int p = 4, m = 8;
  std::vector<std::vector<double>> fwd(p, std::vector<double>(m, 1.0));
  std::vector<std::vector<double>> bwd(p, std::vector<double>(m, 2.0));
  EXPECT_DOUBLE_EQ(OneFOneB(fwd, bwd, 0, 0), (m + p - 1) * 3.0);
  // The first stage's input wait delays everything; each transfer adds to the fill and drain.
  EXPECT_DOUBLE_EQ(OneFOneB(fwd, bwd, 0, 5), (m + p - 1) * 3.0 + 5);
  EXPECT_GE(OneFOneB(fwd, bwd, 0.5, 0), (m + p - 1) * 3.0 + 2 * (p - 1) * 0.5);
  // One stage: its own work.
  EXPECT_DOUBLE_EQ(OneFOneB({fwd[0]}, {bwd[0]}, 0.5, 0), m * 3.0);
}

TEST(TraceSimTest, OneFOneBIsBoundByTheSlowestStage) {
  const int p = 4, m = 16;
  std::vector<std::vector<double>> fwd(p, std::vector<double>(m, 1.0));
  std::vector<std::vector<double>> bwd(p, std::vector<double>(m, 2.0));
  for (double& v : fwd[2]) v = 2;
  for (double& v : bwd[2]) v = 4;
  std::vector<double> ends;
  const double makespan = OneFOneB(fwd, bwd, 0, 0, &ends);
  EXPECT_GE(makespan, m * 6.0);  // the slow stage's own work
  EXPECT_LT(makespan, m * 6.0 + (p - 1) * 6.0);
  EXPECT_EQ(ends.size(), static_cast<size_t>(p));
  EXPECT_DOUBLE_EQ(*std::max_element(ends.begin(), ends.end()), makespan);
}

TEST(TraceSimTest, DpReplayReproducesTheSynchronousStep) {
  const DpTrace t = Repeat(DpStep({0.40, 0.42, 0.41, 0.55}, 0.1), 20);
  const SimResult r = Simulate(t);
  EXPECT_NEAR(r.replay_seconds, 20 * 0.65, 1e-9);
  EXPECT_NEAR(r.measured_seconds, r.replay_seconds, 1e-9);
}

TEST(TraceSimTest, StragglersFixedEndsAtTheSlowestHealthyRank) {
  // Healthy ranks 0.40-0.42, one straggler at 0.55: fixed, the step ends at 0.42 + 0.1, not at
  // the median.
  const DpTrace t = Repeat(DpStep({0.40, 0.42, 0.41, 0.40, 0.41, 0.55}, 0.1), 32);
  const SimResult r = Simulate(t);
  // The straggler becomes the reference (0.41) times a healthy rank's variation (none here).
  EXPECT_NEAR(r.stragglers, 0.65 / 0.52, 1e-9);
}

TEST(TraceSimTest, SlowHalfIsFixedToTheFastHalf) {
  // Two classes of five: the fast class is the reference, the slow one straggles.
  std::vector<double> busy = {0.06, 0.23, 0.06, 0.23, 0.06, 0.23, 0.06, 0.23, 0.06, 0.23};
  const SimResult r = Simulate(Repeat(DpStep(busy, 0.01), 32));
  EXPECT_NEAR(r.stragglers, 0.24 / 0.07, 1e-9);
  // Four slow of ten: the median is a fast rank, the same answer.
  busy[9] = 0.06;
  EXPECT_NEAR(Simulate(Repeat(DpStep(busy, 0.01), 32)).stragglers, 0.24 / 0.07, 1e-9);
}

TEST(TraceSimTest, NoStragglerWithinTheMargin) {
  const SimResult r = Simulate(Repeat(DpStep({0.40, 0.41, 0.42, 0.415}, 0.1), 32));
  EXPECT_DOUBLE_EQ(r.stragglers, 1.0);
}

TEST(TraceSimTest, StragglerScaleKeepsHealthyRanksAndBootstrapsTheFixedOne) {
  // 4 peers over 16 steps, peer 3 twice as slow; healthy peers vary step to step.
  std::vector<std::vector<double>> busy;
  for (int s = 0; s < 16; ++s) {
    const double wobble = 1 + 0.01 * (s % 3);
    busy.push_back({1.0 * wobble, 1.0, 1.0, 2.0});
  }
  const auto scale = StragglerScale(busy, SimOptions());
  for (int s = 0; s < 16; ++s) {
    for (int p = 0; p < 3; ++p) EXPECT_EQ(scale[s][p], 1.0);
    // The fixed peer runs at the reference level (1.0) times a healthy peer's variation around
    // its own level (peer 0: 1.00-1.02 around 1.01).
    const double fixed = busy[s][3] * scale[s][3];
    EXPECT_GE(fixed, 1.0 / 1.01 - 1e-12);
    EXPECT_LE(fixed, 1.02 / 1.01 + 1e-12);
  }
}

TEST(TraceSimTest, OverlapHidesOnlyBehindComputeNotAlreadyHidingCommunication) {
  // 0.2 s compute, 1.0 s collective: at most 0.2 s hides.
  EXPECT_NEAR(Simulate(Repeat(DpStep({0.2, 0.2}, 1.0), 4)).overlap, 1.2 / 1.0, 1e-9);
  // 0.1 s of the compute already hides communication: 0.1 s more can hide.
  EXPECT_NEAR(Simulate(Repeat(DpStep({0.2, 0.2}, 1.0, {}, 0.1), 4)).overlap, 1.2 / 1.1, 1e-9);
  // Plenty of compute: the collective disappears.
  EXPECT_NEAR(Simulate(Repeat(DpStep({0.5, 0.5}, 0.1), 4)).overlap, 0.6 / 0.5, 1e-9);
}

TEST(TraceSimTest, DataStallOfOneRankIsItsWholeWait) {
  // Rank 2 waits 0.15 s for data; the others 0.01 s. Removing data waits ends the step at
  // the largest compute, not the median data wait earlier.
  const DpTrace t = Repeat(DpStep({0.3, 0.3, 0.3, 0.3}, 0.05, {0.01, 0.01, 0.15, 0.01}), 8);
  EXPECT_NEAR(Simulate(t).data, 0.50 / 0.35, 1e-9);
}

PipelineTrace Pipe(int stages, int replicas, int mbs, double slow_stage_factor, int slow_stage,
                   double data0, double collective) {
  PipelineTrace t;
  t.name = "p";
  t.stages = stages;
  t.replicas = replicas;
  t.microbatches = mbs;
  for (int k = 0; k < 32; ++k) {
    std::vector<StageStep> rs(stages * replicas);
    for (int r = 0; r < stages * replicas; ++r) {
      const double f = r % stages == slow_stage ? slow_stage_factor : 1.0;
      rs[r].fwd.assign(mbs, 1.0 * f);
      rs[r].bwd.assign(mbs, 2.0 * f);
      if (r % stages == 0) rs[r].data = data0;
    }
    t.steps.push_back(k);
    t.rank_steps.push_back(rs);
    t.collective.push_back(collective);
  }
  return t;
}

TEST(TraceSimTest, PipelineBalancedSpreadsTheSlowStagesWork) {
  const PipelineTrace t = Pipe(4, 2, 8, 2.0, 2, 0, 0);
  const SimResult r = Simulate(t);
  // Balanced: every stage does the mean, 1.25 x (1 + 2) per micro-batch.
  const double balanced = (8 + 4 - 1) * 3.0 * 1.25;
  EXPECT_NEAR(r.replay_seconds / r.pipeline, 32 * balanced, 1e-6);
  EXPECT_GT(r.pipeline, 1.2);
  // The slow stage is a stage, not a straggler: its replicas are all alike.
  EXPECT_DOUBLE_EQ(r.stragglers, 1.0);
}

TEST(TraceSimTest, PipelineDataAndCollective) {
  const PipelineTrace t = Pipe(4, 2, 8, 1.0, -1, 3.0, 4.0);
  const SimResult r = Simulate(t);
  const double step = (8 + 4 - 1) * 3.0 + 3.0 + 4.0;
  EXPECT_NEAR(r.replay_seconds, 32 * step, 1e-6);
  EXPECT_NEAR(r.data, step / (step - 3.0), 1e-9);     // the first stage's wait delays all
  EXPECT_NEAR(r.overlap, step / (step - 4.0), 1e-9);  // the collective hides behind 24 s compute
  EXPECT_DOUBLE_EQ(r.pipeline, 1.0);
}

TEST(TraceSimTest, GeneratedTracesAreDeterministic) {
  const auto a = GeneratedDpTraces(), b = GeneratedDpTraces();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(Total(ReplayDp(a[i], Fix::kNone)), Total(ReplayDp(b[i], Fix::kNone)));
  }
  EXPECT_EQ(GeneratedPipelineTraces().size(), 3u);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(TraceSimTest, LoadsKinetoStepsAndKeepsStepsEveryRankHas) {
  const std::string path =
      WriteTemp("steps.csv",
                "trace,rank,world_size,step,step_s,data_s,compute_s,comm_s,exposed_comm_s,other_s\n"
                "a,0,8,1,0.5,0.01,0.3,0.2,0.15,0.04\n"
                "a,3,8,1,0.5,0.01,0.35,0.15,0.10,0.04\n"
                "a,0,8,2,0.5,0.01,0.3,0.2,0.15,0.04\n"
                "b,0,1,7,0.2,0,0.1,0,0,0.1\n");
  auto ts = LoadKinetoSteps(path);
  ASSERT_OK(ts);
  ASSERT_EQ(ts->size(), 2u);
  const DpTrace& a = (*ts)[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.ranks, 2);
  EXPECT_EQ(a.job_world_size, 8);
  ASSERT_EQ(a.steps, std::vector<int64_t>{1});  // rank 3 lacks step 2
  EXPECT_DOUBLE_EQ(a.rank_steps[0][1].compute, 0.35);
  EXPECT_DOUBLE_EQ(a.rank_steps[0][1].exposed_comm, 0.10);
  EXPECT_DOUBLE_EQ(a.rank_steps[0][1].comm, 0.15);
  EXPECT_EQ((*ts)[1].ranks, 1);
}

TEST(TraceSimTest, LoaderErrors) {
  EXPECT_EQ(LoadKinetoSteps("/nonexistent/x.csv").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadKinetoSteps(WriteTemp("bad-header.csv", "a,b\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LoadKinetoSteps(
          WriteTemp("bad-row.csv",
                    "trace,rank,world_size,step,step_s,data_s,compute_s,comm_s,exposed_comm_s,"
                    "other_s\na,0,8,1,0.5,-1,0.3,0.2,0.15,0.04\n"))
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadPaiTrace("/nonexistent/job.csv", "j").status().code(), absl::StatusCode::kNotFound);
  auto pai = LoadPaiTrace(WriteTemp("pai.csv",
                                    ",worker,gpu,time,batch_time_norm\n0,0,25,1,400\n1,1,25,1,500\n"
                                    "2,0,25,11,410\n"),
                          "j");
  ASSERT_OK(pai);
  ASSERT_EQ(pai->steps.size(), 1u);  // step 1 lacks worker 1
  EXPECT_DOUBLE_EQ(pai->rank_steps[0][0].exposed_comm, 0.1);
  EXPECT_DOUBLE_EQ(pai->rank_steps[0][1].step, 0.5);
}

}  // namespace
}  // namespace stepwatch::sim
