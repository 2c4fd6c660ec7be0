// The collector's memory budget: admission by accounted cost, refusal counted, charges returned,
// tracked jobs still analysed; and the default budget rule.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "collector/metrics.h"
#include "collector/server.h"
#include "collector/state.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/collector/test_util.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

using testing::EmptyBatch;
using testing::StepBatch;

constexpr int64_t kSecond = 1'000'000'000;

uint64_t Count(const std::map<std::string, uint64_t>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

// What a job of `ranks` ranks (world size `ranks`) reported from one node costs.
int64_t JobCost(const MemoryCosts& c, int ranks) {
  return c.job + c.rank_slot * ranks + c.rank * ranks;
}

TEST(MemoryBudgetTest, CostsGrowWithTheWindows) {
  analysis::EngineOptions small;
  small.window_steps = 16;
  analysis::EngineOptions big;
  big.window_steps = 256;
  EXPECT_GT(MemoryCostsFor(big).rank, MemoryCostsFor(small).rank);
  const MemoryCosts c = MemoryCostsFor({});
  EXPECT_GT(c.job, 0);
  EXPECT_GT(c.rank, c.rank_slot);
  EXPECT_GT(c.node, 0);
  EXPECT_GT(c.gpu, 0);
}

TEST(MemoryBudgetTest, RefusesNewWorkBeyondTheBudgetAndKeepsAnalysingTrackedJobs) {
  SimulatedClock clock;
  CollectorStateOptions o;
  const MemoryCosts c = MemoryCostsFor(o.engine);
  // Room for one node and one job of 8 ranks, not for a second job.
  o.max_memory_bytes = c.node + JobCost(c, 8) + c.rank;
  CollectorState state(o, &clock);
  uint64_t seq = 0;
  for (int step = 0; step < 60; ++step) {
    ASSERT_OK(state.Apply(StepBatch("n0", ++seq, "kept", 8, step, 0.1, 5, 0.16)));
    if (step == 10) {
      // The flood: a new job, and new ranks of the tracked job beyond its world.
      ASSERT_OK(state.Apply(StepBatch("n0", ++seq, "flood", 8, 0, 0.1)));
    }
    clock.AdvanceTime(absl::Milliseconds(200));
    state.Tick();
  }
  StateSnapshot s = state.Snapshot();
  EXPECT_GE(Count(s.counters.limit_hits, "memory"), 8u);
  EXPECT_GE(Count(s.counters.steps_rejected, "limit"), 8u);
  EXPECT_LE(s.memory_accounted_bytes, o.max_memory_bytes);
  EXPECT_EQ(s.memory_accounted_bytes, c.node + JobCost(c, 8));
  EXPECT_EQ(s.memory_budget_bytes, o.max_memory_bytes);
  ASSERT_EQ(s.jobs.size(), 1u);
  EXPECT_EQ(s.jobs[0].job, "kept");
  EXPECT_EQ(s.jobs[0].last_step, 59);
  const v1::FindingsResponse findings = state.Findings("kept");
  EXPECT_TRUE(
      std::any_of(findings.findings().begin(), findings.findings().end(),
                  [](const v1::Finding& f) { return f.kind() == "straggler" && f.rank() == 5; }))
      << findings.DebugString();
}

TEST(MemoryBudgetTest, NodesAndGpusAreCharged) {
  SimulatedClock clock;
  CollectorStateOptions o;
  const MemoryCosts c = MemoryCostsFor(o.engine);
  o.max_memory_bytes = c.node + 2 * c.gpu;
  CollectorState state(o, &clock);
  v1::ReportBatch b = EmptyBatch("n0", 1);
  for (int g = 0; g < 4; ++g) b.add_gpus()->set_index(g);
  ASSERT_OK(state.Apply(b));
  ASSERT_OK(state.Apply(EmptyBatch("n1", 1)));
  state.Tick();  // readers see what the last Tick published
  StateSnapshot s = state.Snapshot();
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].gpus.size(), 2u);
  EXPECT_EQ(Count(s.counters.limit_hits, "memory"), 3u);  // two GPUs and a node
  EXPECT_EQ(s.memory_accounted_bytes, o.max_memory_bytes);
}

TEST(MemoryBudgetTest, ChargesAreReturnedWhenJobsAndNodesAreForgotten) {
  SimulatedClock clock;
  CollectorStateOptions o;
  const MemoryCosts c = MemoryCostsFor(o.engine);
  o.expire_nanos = 60 * kSecond;
  o.max_memory_bytes = c.node + JobCost(c, 4);
  CollectorState state(o, &clock);
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "old", 4, 0, 0.1)));
  EXPECT_EQ(state.MemoryAccountedBytes(), o.max_memory_bytes);
  clock.AdvanceTime(absl::Seconds(61));
  state.Tick();
  EXPECT_EQ(state.MemoryAccountedBytes(), 0);
  // The room is free again for a new job.
  ASSERT_OK(state.Apply(StepBatch("n1", 1, "new", 4, 0, 0.1)));
  state.Tick();
  StateSnapshot s = state.Snapshot();
  ASSERT_EQ(s.jobs.size(), 1u);
  EXPECT_EQ(s.jobs[0].job, "new");
  EXPECT_EQ(Count(s.counters.limit_hits, "memory"), 0u);
}

TEST(MemoryBudgetTest, RescaledJobIsChargedForItsLargerWorld) {
  SimulatedClock clock;
  CollectorStateOptions o;
  const MemoryCosts c = MemoryCostsFor(o.engine);
  CollectorState state(o, &clock);
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "job", 2, 0, 0.1)));
  ASSERT_OK(state.Apply(StepBatch("n0", 2, "job", 4, 1, 0.1)));
  EXPECT_EQ(state.MemoryAccountedBytes(), c.node + JobCost(c, 4));
}

// The steps of `ranks` of a StepBatch, as sent by `node`.
v1::ReportBatch RanksFrom(const std::string& node, uint64_t seq, const std::string& job,
                          int world_size, int64_t step, const std::vector<int>& ranks) {
  v1::ReportBatch all = StepBatch(node, seq, job, world_size, step, 0.1);
  v1::ReportBatch b = all;
  b.clear_steps();
  for (int r : ranks) *b.add_steps() = all.steps(r);
  return b;
}

// The engine's registry is the one record of ranks: when a node is forgotten, its ranks leave the
// engine and their charges together, and they are admitted (and charged) afresh when they return.
TEST(MemoryBudgetTest, ForgettingANodeReturnsItsRanksCharges) {
  SimulatedClock clock;
  CollectorStateOptions o;
  const MemoryCosts c = MemoryCostsFor(o.engine);
  o.expire_nanos = 60 * kSecond;
  o.max_memory_bytes = 2 * c.node + JobCost(c, 4);
  // Admission alone: a timeline would take the room the forgotten ranks leave.
  o.reports.timeline.enabled = false;
  CollectorState state(o, &clock);
  ASSERT_OK(state.Apply(RanksFrom("n0", 1, "job", 4, 0, {0, 1})));
  ASSERT_OK(state.Apply(RanksFrom("n1", 1, "job", 4, 0, {2, 3})));
  EXPECT_EQ(state.MemoryAccountedBytes(), o.max_memory_bytes);
  clock.AdvanceTime(absl::Seconds(40));
  ASSERT_OK(state.Apply(RanksFrom("n1", 2, "job", 4, 1, {2, 3})));
  clock.AdvanceTime(absl::Seconds(30));  // n0 unseen for 70 s, the job for 30 s
  state.Tick();
  EXPECT_EQ(state.MemoryAccountedBytes(), c.node + JobCost(c, 4) - 2 * c.rank);
  absl::StatusOr<v1::ExplainResponse> explain = state.Explain("job");
  ASSERT_OK(explain);
  ASSERT_EQ(explain->ranks_size(), 2);
  EXPECT_EQ(explain->ranks(0).rank(), 2);
  EXPECT_EQ(explain->ranks(1).rank(), 3);
  // Ranks 0 and 1 come back from another node: within the budget again, charged again.
  ASSERT_OK(state.Apply(RanksFrom("n2", 1, "job", 4, 2, {0, 1})));
  EXPECT_EQ(state.MemoryAccountedBytes(), o.max_memory_bytes);
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(Count(s.counters.limit_hits, "memory"), 0u);
  explain = state.Explain("job");
  ASSERT_OK(explain);
  EXPECT_EQ(explain->ranks_size(), 4);
  // A fifth rank of a world of 4 cannot come: a further job would exceed the budget.
  ASSERT_OK(state.Apply(RanksFrom("n2", 2, "other", 1, 0, {0})));
  state.Tick();
  EXPECT_EQ(Count(state.Snapshot().counters.limit_hits, "memory"), 1u);
}

TEST(MemoryBudgetTest, NoBudgetRefusesNothingButStillAccounts) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  for (int j = 0; j < 20; ++j) {
    ASSERT_OK(state.Apply(StepBatch("n0", j + 1, "job" + std::to_string(j), 64, 0, 0.1)));
  }
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.jobs.size(), 20u);
  EXPECT_EQ(Count(s.counters.limit_hits, "memory"), 0u);
  EXPECT_EQ(s.memory_budget_bytes, 0);
  EXPECT_EQ(s.memory_accounted_bytes, MemoryCostsFor({}).node +
                                          20 * JobCost(MemoryCostsFor({}), 64) +
                                          state.reports().timeline_bytes());
}

TEST(MemoryBudgetTest, GaugesAndLimitHitsOnMetrics) {
  StateSnapshot s;
  s.memory_accounted_bytes = 1234;
  s.memory_budget_bytes = 4096;
  s.counters.limit_hits["memory"] = 7;
  std::vector<prometheus::MetricFamily> fams = BuildMetricFamilies(s, {});
  auto value = [&](const std::string& name, const std::string& label) -> double {
    for (const auto& f : fams) {
      if (f.name != name) continue;
      for (const auto& m : f.metric) {
        if (label.empty())
          return f.type == prometheus::MetricType::Gauge ? m.gauge.value : m.counter.value;
        for (const auto& l : m.label) {
          if (l.value == label) return m.counter.value;
        }
      }
    }
    return -1;
  };
  EXPECT_EQ(value("stepwatch_collector_memory_accounted_bytes", ""), 1234);
  EXPECT_EQ(value("stepwatch_collector_memory_budget_bytes", ""), 4096);
  EXPECT_EQ(value("stepwatch_collector_limit_hits_total", "memory"), 7);
}

// The receive limit must let through the largest batch an agent sends (agent/collector_link.h
// max_events_per_batch steps, names at their longest, every GPU field), or that agent would resend
// it forever.
TEST(MemoryBudgetTest, LargestAgentBatchFitsTheReceiveLimit) {
  constexpr int kMaxEventsPerBatch = 16384;
  const std::string name(256, 'j');
  v1::ReportBatch b = EmptyBatch(std::string(256, 'n'), ~uint64_t{0});
  b.set_agent_id(std::string(256, 'a'));
  b.set_boot_id(std::string(36, 'b'));
  b.set_base_seq(~uint64_t{0});
  for (int i = 0; i < kMaxEventsPerBatch; ++i) {
    v1::StepEvent* e = b.add_steps();
    e->set_job(name);
    e->set_rank(INT32_MAX);
    e->set_world_size(INT32_MAX);
    e->set_local_rank(INT32_MAX);
    e->set_gpu(INT32_MAX);
    e->set_dp_rank(INT32_MAX);
    e->set_pp_stage(INT32_MAX);
    e->set_tp_rank(INT32_MAX);
    e->set_pid(INT32_MAX);
    e->set_step(INT64_MAX);
    e->set_samples(INT64_MAX);
    e->set_received_unix_nanos(INT64_MAX);
    e->set_step_seconds(0.1);
    e->set_data_seconds(0.1);
    e->set_compute_seconds(0.1);
    e->set_comm_seconds(0.1);
  }
  for (int g = 0; g < 64; ++g) {
    v1::GpuSample* s = b.add_gpus();
    s->set_index(g);
    s->set_uuid(std::string(40, 'u'));
    s->set_name(std::string(64, 'g'));
    s->set_utilization_gpu_ratio(1);
    s->set_memory_used_bytes(UINT64_MAX);
    for (int p = 0; p < 64; ++p) s->add_pids(UINT32_MAX);
  }
  EXPECT_LT(b.ByteSizeLong(),
            static_cast<size_t>(CollectorServerOptions{}.max_receive_message_bytes));
  std::printf("largest agent batch: %zu bytes\n", b.ByteSizeLong());
}

TEST(MemoryBudgetTest, StatusAnswerStaysUnderItsSizeLimit) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.max_answer_bytes = 20'000;
  CollectorState state(o, &clock);
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "job", 8, 0, 0.1)));
  for (int n = 0; n < 100; ++n) {
    v1::ReportBatch b = EmptyBatch("node-" + std::to_string(n), 1);
    for (int g = 0; g < 8; ++g) {
      v1::GpuSample* s = b.add_gpus();
      s->set_index(g);
      s->set_name("NVIDIA H100 80GB HBM3");
      for (int p = 0; p < 8; ++p) s->add_pids(100000 + p);
    }
    ASSERT_OK(state.Apply(b));
  }
  state.Tick();
  const v1::StatusResponse status = state.Status();
  EXPECT_EQ(status.jobs_size(), 1);
  EXPECT_GT(status.nodes_size(), 0);
  EXPECT_LT(status.nodes_size(), 101);
  // Under the limit plus at most one node.
  EXPECT_LT(status.ByteSizeLong(), 20'000u + status.nodes(0).ByteSizeLong() + 16);
}

TEST(MemoryBudgetTest, FindingsAnswerStaysUnderItsSizeLimit) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.max_answer_bytes = 300;
  CollectorState state(o, &clock);
  // Idle GPUs (no job on them) are findings of their own: one per GPU.
  for (int step = 0; step < 40; ++step) {
    v1::ReportBatch b = EmptyBatch("n0", step + 1);
    for (int g = 0; g < 32; ++g) {
      v1::GpuSample* s = b.add_gpus();
      s->set_index(g);
      s->set_utilization_gpu_ratio(0);
    }
    ASSERT_OK(state.Apply(b));
    clock.AdvanceTime(absl::Seconds(1));
    state.Tick();
  }
  const int all = static_cast<int>(state.Snapshot().findings.size());
  ASSERT_GT(all, 3);
  const v1::FindingsResponse findings = state.Findings("");
  EXPECT_GT(findings.findings_size(), 0);
  EXPECT_LT(findings.findings_size(), all);
  EXPECT_LT(findings.ByteSizeLong(), 300u + findings.findings(0).ByteSizeLong() + 16);
}

class DefaultBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/budget-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_EQ(std::system(("rm -rf '" + root_ + "' && mkdir -p '" + root_ + "/memory'").c_str()),
              0);
    meminfo_ = root_ + "/meminfo";
  }
  void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  std::string root_;
  std::string meminfo_;
};

constexpr int64_t kMiB = int64_t{1} << 20;

TEST_F(DefaultBudgetTest, HalfOfTheCgroupLimit) {
  Write(meminfo_, "MemTotal:       65536000 kB\nMemFree: 1 kB\n");
  Write(root_ + "/memory.max", "2147483648\n");
  EXPECT_EQ(DefaultMemoryBudgetBytes(root_, meminfo_), 1024 * kMiB);
}

TEST_F(DefaultBudgetTest, HalfOfMemTotalWithoutALimit) {
  Write(meminfo_, "MemTotal:        4194304 kB\n");
  Write(root_ + "/memory.max", "max\n");
  Write(root_ + "/memory/memory.limit_in_bytes", "9223372036854771712\n");  // cgroup v1: none
  EXPECT_EQ(DefaultMemoryBudgetBytes(root_, meminfo_), 2048 * kMiB);
}

TEST_F(DefaultBudgetTest, ClampedToFloorAndCeiling) {
  Write(meminfo_, "MemTotal:       262144 kB\n");  // 256 MiB
  EXPECT_EQ(DefaultMemoryBudgetBytes(root_, meminfo_), 256 * kMiB);
  Write(meminfo_, "MemTotal:       2147483648 kB\n");  // 2 TiB
  EXPECT_EQ(DefaultMemoryBudgetBytes(root_, meminfo_), 16384 * kMiB);
  EXPECT_EQ(DefaultMemoryBudgetBytes(root_ + "/none", root_ + "/none"), 256 * kMiB);
}

}  // namespace
}  // namespace stepwatch::collector
