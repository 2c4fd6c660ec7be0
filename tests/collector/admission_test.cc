// Identity binding and admission bounds at the collector: a (job, rank) is held by the node that
// reports it (other nodes' steps, exits and rescales are refused and counted per node) until that
// node goes silent for --expire or the rank's process exits; one node may open at most
// max_jobs_per_node jobs; every string a batch carries is bounded (its batch or its item refused,
// counted by field and reason) and what is kept is charged.
#include <algorithm>
#include <string>
#include <vector>

#include "collector/convert.h"
#include "collector/metrics.h"
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

template <typename Map, typename Key>
uint64_t Count(const Map& m, const Key& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

uint64_t NodeRefusals(const CollectorCounters& c, const std::string& node,
                      const std::string& reason) {
  return Count(c.node_refusals, std::make_pair(node, reason));
}

// The steps of `ranks` of a StepBatch, as sent by `node`, each with a pid (so that exits match).
v1::ReportBatch RanksFrom(const std::string& node, uint64_t seq, const std::string& job,
                          int world_size, int64_t step, const std::vector<int>& ranks,
                          double busy_seconds = 0.1) {
  v1::ReportBatch all = StepBatch(node, seq, job, world_size, step, busy_seconds);
  v1::ReportBatch b = all;
  b.clear_steps();
  for (int r : ranks) {
    v1::StepEvent* e = b.add_steps();
    *e = all.steps(r);
    e->set_pid(1000 + r);
  }
  return b;
}

v1::RankExit Exit(const std::string& job, int rank) {
  v1::RankExit x;
  x.set_job(job);
  x.set_rank(rank);
  x.set_pid(1000 + rank);
  return x;
}

// Node of each rank of `job` as Explain shows it.
std::vector<std::string> RankNodes(const CollectorState& state, const std::string& job) {
  std::vector<std::string> out;
  absl::StatusOr<v1::ExplainResponse> e = state.Explain(job);
  if (!e.ok()) return out;
  for (const v1::RankRow& r : e->ranks()) out.push_back(r.node());
  return out;
}

TEST(AdmissionTest, AnotherNodeCannotInjectStepsOrEndTheRanksOfARunningJob) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  uint64_t a_seq = 0;
  uint64_t b_seq = 0;
  for (int step = 0; step < 40; ++step) {
    ASSERT_OK(state.Apply(RanksFrom("node-a", ++a_seq, "train", 4, step, {0, 1, 2, 3})));
    if (step == 20) {
      // node-b sends one (slow) step for every rank, then their exits.
      ASSERT_TRUE(
          state.Apply(RanksFrom("node-b", ++b_seq, "train", 4, step + 1, {0, 1, 2, 3}, 0.5)).ok());
      v1::ReportBatch exits = EmptyBatch("node-b", ++b_seq);
      for (int r = 0; r < 4; ++r) *exits.add_rank_exits() = Exit("train", r);
      ASSERT_OK(state.Apply(exits));
    }
    clock.AdvanceTime(absl::Milliseconds(200));
    state.Tick();
  }
  const StateSnapshot s = state.Snapshot();
  EXPECT_EQ(Count(s.counters.steps_rejected, std::string("foreign")), 4u);
  EXPECT_EQ(Count(s.counters.refused, std::string("rank_foreign")), 4u);
  EXPECT_EQ(Count(s.counters.refused, std::string("rank_exit_foreign")), 4u);
  EXPECT_EQ(NodeRefusals(s.counters, "node-b", "rank_foreign"), 4u);
  EXPECT_EQ(NodeRefusals(s.counters, "node-b", "rank_exit_foreign"), 4u);
  EXPECT_EQ(NodeRefusals(s.counters, "node-a", "rank_foreign"), 0u);
  EXPECT_EQ(s.counters.jobs_finished, 0u);
  EXPECT_EQ(s.counters.rank_takeovers, 0u);
  ASSERT_EQ(s.jobs.size(), 1u);
  EXPECT_EQ(s.jobs[0].last_step, 39);
  EXPECT_EQ(s.jobs[0].ranks_reporting, 4);
  EXPECT_EQ(state.Findings("train").findings_size(), 0) << state.Findings("train").DebugString();
  EXPECT_EQ(RankNodes(state, "train"),
            std::vector<std::string>({"node-a", "node-a", "node-a", "node-a"}));
}

TEST(AdmissionTest, AnotherNodeCannotRescaleAJobWhoseRanksRunElsewhere) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  ASSERT_OK(state.Apply(RanksFrom("node-a", 1, "train", 2, 0, {0, 1})));
  // A new rank in a larger world would reset the job: refused from a node that holds none of it.
  ASSERT_OK(state.Apply(RanksFrom("node-b", 1, "train", 3, 1, {2})));
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(NodeRefusals(s.counters, "node-b", "job_foreign"), 1u);
  ASSERT_EQ(s.jobs.size(), 1u);
  EXPECT_EQ(s.jobs[0].world_size, 2);
  // Its own node may rescale it; then the new rank is anyone's to report.
  ASSERT_OK(state.Apply(RanksFrom("node-a", 2, "train", 3, 1, {0, 1})));
  ASSERT_OK(state.Apply(RanksFrom("node-b", 2, "train", 3, 1, {2})));
  state.Tick();
  s = state.Snapshot();
  EXPECT_EQ(NodeRefusals(s.counters, "node-b", "job_foreign"), 1u);
  ASSERT_EQ(s.jobs.size(), 1u);
  EXPECT_EQ(s.jobs[0].world_size, 3);
  EXPECT_EQ(RankNodes(state, "train"), std::vector<std::string>({"node-a", "node-a", "node-b"}));
}

TEST(AdmissionTest, ARankIsTakenOverOnceItsNodeWasSilentForExpire) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.expire_nanos = 60 * kSecond;
  CollectorState state(o, &clock);
  uint64_t a_seq = 0;
  uint64_t b_seq = 0;
  ASSERT_OK(state.Apply(RanksFrom("node-a", ++a_seq, "train", 4, 0, {0, 1})));
  ASSERT_OK(state.Apply(RanksFrom("node-b", ++b_seq, "train", 4, 0, {2, 3})));
  // While node-a reports ranks 0 and 1, they are its own.
  ASSERT_OK(state.Apply(RanksFrom("node-b", ++b_seq, "train", 4, 1, {0, 1, 2, 3})));
  state.Tick();
  EXPECT_EQ(NodeRefusals(state.Snapshot().counters, "node-b", "rank_foreign"), 2u);
  // node-a keeps reporting rank 0 (so it stays, as does the node) but not rank 1.
  for (int step = 2; step < 9; ++step) {
    clock.AdvanceTime(absl::Seconds(10));
    ASSERT_OK(state.Apply(RanksFrom("node-a", ++a_seq, "train", 4, step, {0})));
    ASSERT_OK(state.Apply(RanksFrom("node-b", ++b_seq, "train", 4, step, {2, 3})));
    state.Tick();
  }
  // Rank 1 was last seen 70 s ago: node-b takes it over; rank 0 is still node-a's.
  ASSERT_OK(state.Apply(RanksFrom("node-b", ++b_seq, "train", 4, 9, {0, 1, 2, 3})));
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.counters.rank_takeovers, 1u);
  EXPECT_EQ(NodeRefusals(s.counters, "node-b", "rank_foreign"), 3u);
  EXPECT_EQ(RankNodes(state, "train"),
            std::vector<std::string>({"node-a", "node-b", "node-b", "node-b"}));
  // node-a falls silent: once forgotten (with its ranks), rank 0 moves too.
  for (int step = 10; step < 18; ++step) {
    clock.AdvanceTime(absl::Seconds(10));
    ASSERT_OK(state.Apply(RanksFrom("node-b", ++b_seq, "train", 4, step, {1, 2, 3})));
    state.Tick();
  }
  ASSERT_OK(state.Apply(RanksFrom("node-b", ++b_seq, "train", 4, 18, {0, 1, 2, 3})));
  state.Tick();
  s = state.Snapshot();
  EXPECT_EQ(Count(s.counters.expired, std::string("node")), 1u);
  EXPECT_EQ(NodeRefusals(s.counters, "node-b", "rank_foreign"), 3u);
  EXPECT_EQ(RankNodes(state, "train"),
            std::vector<std::string>({"node-b", "node-b", "node-b", "node-b"}));
}

TEST(AdmissionTest, AnExitedOrReleasedRankIsTakenOverAtOnce) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  ASSERT_OK(state.Apply(RanksFrom("node-a", 1, "train", 3, 0, {0, 1, 2})));
  v1::ReportBatch exits = RanksFrom("node-a", 2, "train", 3, 1, {1, 2});
  *exits.add_rank_exits() = Exit("train", 0);
  ASSERT_OK(state.Apply(exits));
  // Rank 0's process exited on node-a: it restarts on node-b.
  ASSERT_OK(state.Apply(RanksFrom("node-b", 1, "train", 3, 2, {0})));
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.counters.rank_takeovers, 1u);
  EXPECT_EQ(Count(s.counters.refused, std::string("rank_foreign")), 0u);
  EXPECT_EQ(RankNodes(state, "train"), std::vector<std::string>({"node-b", "node-a", "node-a"}));
  // Now node-a cannot end it, node-b can.
  v1::ReportBatch forged = EmptyBatch("node-a", 3);
  *forged.add_rank_exits() = Exit("train", 0);
  ASSERT_OK(state.Apply(forged));
  state.Tick();
  EXPECT_EQ(NodeRefusals(state.Snapshot().counters, "node-a", "rank_exit_foreign"), 1u);
}

TEST(AdmissionTest, OneNodeCannotOpenMoreThanItsShareOfJobs) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.engine.max_jobs = 10;
  o.max_jobs_per_node = 3;
  CollectorState state(o, &clock);
  uint64_t seq = 0;
  for (int j = 0; j < 8; ++j) {
    ASSERT_TRUE(
        state.Apply(RanksFrom("node-b", ++seq, "invented-" + std::to_string(j), 1, 0, {0})).ok());
  }
  // Other nodes' new jobs are still admitted.
  ASSERT_OK(state.Apply(RanksFrom("node-a", 1, "real", 2, 0, {0, 1})));
  // A node may join a job another node opened: that is not opening one.
  ASSERT_OK(state.Apply(RanksFrom("node-a", 2, "shared", 2, 0, {0})));
  ASSERT_OK(state.Apply(RanksFrom("node-b", ++seq, "shared", 2, 0, {1})));
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.jobs.size(), 5u);  // invented-0..2, real, shared
  EXPECT_EQ(Count(s.counters.limit_hits, std::string("jobs_per_node")), 5u);
  EXPECT_EQ(NodeRefusals(s.counters, "node-b", "jobs_per_node"), 5u);
  EXPECT_EQ(NodeRefusals(s.counters, "node-a", "jobs_per_node"), 0u);
  EXPECT_EQ(Count(s.counters.steps_rejected, std::string("limit")), 5u);
  EXPECT_EQ(RankNodes(state, "shared"), std::vector<std::string>({"node-a", "node-b"}));
  // A slot comes back when one of its jobs ends.
  v1::ReportBatch exits = EmptyBatch("node-b", ++seq);
  *exits.add_rank_exits() = Exit("invented-0", 0);
  ASSERT_OK(state.Apply(exits));
  ASSERT_OK(state.Apply(RanksFrom("node-b", ++seq, "invented-9", 1, 0, {0})));
  state.Tick();
  s = state.Snapshot();
  EXPECT_EQ(s.counters.jobs_finished, 1u);
  EXPECT_EQ(NodeRefusals(s.counters, "node-b", "jobs_per_node"), 5u);
  EXPECT_OK(state.Explain("invented-9"));
}

TEST(AdmissionTest, RefusalsNameAtMost64Nodes) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  ASSERT_OK(state.Apply(RanksFrom("holder", 1, "train", 1, 0, {0})));
  for (int n = 0; n < 70; ++n) {
    ASSERT_OK(state.Apply(RanksFrom("forger-" + std::to_string(n), 1, "train", 1, 1, {0})));
  }
  state.Tick();
  const StateSnapshot s = state.Snapshot();
  EXPECT_EQ(Count(s.counters.refused, std::string("rank_foreign")), 70u);
  EXPECT_EQ(NodeRefusals(s.counters, "_other", "rank_foreign"), 6u);
  EXPECT_EQ(s.counters.node_refusals.size(), 65u);
}

TEST(AdmissionTest, IdentifiersOutOfBoundsRefuseTheBatch) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  v1::ReportBatch b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  b.set_boot_id(std::string(kMaxBootIdBytes + 1, 'b'));
  EXPECT_EQ(state.Apply(b).status().code(), absl::StatusCode::kInvalidArgument);
  b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  b.set_agent_id(std::string(kMaxNodeNameBytes + 1, 'a'));
  EXPECT_EQ(state.Apply(b).status().code(), absl::StatusCode::kInvalidArgument);
  b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  b.set_boot_id("boot\n1");
  EXPECT_EQ(state.Apply(b).status().code(), absl::StatusCode::kInvalidArgument);
  b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  b.clear_agent_id();
  EXPECT_EQ(state.Apply(b).status().code(), absl::StatusCode::kInvalidArgument);
  // Within every bound: applied.
  b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  b.set_boot_id(std::string(kMaxBootIdBytes, 'b'));
  b.set_agent_id(std::string(kMaxNodeNameBytes, 'a'));
  EXPECT_OK(state.Apply(b));
  state.Tick();
  const StateSnapshot s = state.Snapshot();
  EXPECT_EQ(Count(s.counters.malformed, std::string("bad_field")), 3u);
  EXPECT_EQ(Count(s.counters.malformed, std::string("missing_field")), 1u);
  EXPECT_EQ(s.counters.ingest_errors, 4u);
  EXPECT_EQ(Count(s.counters.fields_refused,
                  std::make_pair(std::string("boot_id"), std::string("too_long"))),
            1u);
  EXPECT_EQ(Count(s.counters.fields_refused,
                  std::make_pair(std::string("boot_id"), std::string("control_character"))),
            1u);
  EXPECT_EQ(Count(s.counters.fields_refused,
                  std::make_pair(std::string("agent_id"), std::string("too_long"))),
            1u);
  EXPECT_EQ(s.counters.batches_received, 1u);
}

TEST(AdmissionTest, OtherFieldsOutOfBoundsRefuseTheirItemAndTheRestApplies) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  v1::ReportBatch b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  b.mutable_node()->set_hostname(std::string(4 << 20, 'h'));
  v1::GpuSample* named = b.add_gpus();
  named->set_index(0);
  named->set_name(std::string(kMaxGpuTextBytes + 1, 'g'));
  v1::GpuSample* pids = b.add_gpus();
  pids->set_index(1);
  for (int i = 0; i <= kMaxGpuPids; ++i) pids->add_pids(i);
  v1::GpuSample* reasons = b.add_gpus();
  reasons->set_index(2);
  (*reasons->mutable_unavailable_metrics())["power"] = "not\x1bsupported";
  v1::GpuSample* fine = b.add_gpus();
  fine->set_index(3);
  fine->set_name("NVIDIA H100 80GB HBM3");
  b.mutable_host()->set_memory_bandwidth_source(std::string(kMaxHostTextBytes + 1, 's'));
  ASSERT_OK(state.Apply(b));
  state.Tick();
  const StateSnapshot s = state.Snapshot();
  const auto refused = [&](const char* field, const char* reason) {
    return Count(s.counters.fields_refused,
                 std::make_pair(std::string(field), std::string(reason)));
  };
  EXPECT_EQ(refused("hostname", "too_long"), 1u);
  EXPECT_EQ(refused("gpu_name", "too_long"), 1u);
  EXPECT_EQ(refused("gpu_pids", "too_long"), 1u);
  EXPECT_EQ(refused("gpu_unavailable_metrics", "control_character"), 1u);
  EXPECT_EQ(refused("host_memory_bandwidth_source", "too_long"), 1u);
  EXPECT_EQ(s.counters.ingest_errors, 0u);
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].info.hostname(), "");  // the description was not kept
  ASSERT_EQ(s.nodes[0].gpus.size(), 1u);
  EXPECT_EQ(s.nodes[0].gpus[0].index(), 3);
  EXPECT_FALSE(s.nodes[0].host.has_value());
  ASSERT_EQ(s.jobs.size(), 1u);  // the steps were applied
  // What is kept is charged; nothing of the refused items.
  const MemoryCosts c = MemoryCostsFor({});
  EXPECT_EQ(s.memory_accounted_bytes, c.node + c.gpu + StringHeapBytes(fine->name()) +
                                          2 * (c.rank_slot + c.rank) + c.job +
                                          state.reports().timeline_bytes());
}

TEST(AdmissionTest, KeptStringsAreChargedAndEveryChargeIsReturned) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.expire_nanos = 60 * kSecond;
  CollectorState state(o, &clock);
  const MemoryCosts c = MemoryCostsFor(o.engine);
  const std::string node(kMaxNodeNameBytes, 'n');
  const std::string job(256, 'j');
  v1::ReportBatch b = StepBatch(node, 1, job, 2, 0, 0.1);
  b.set_agent_id(std::string(kMaxNodeNameBytes, 'a'));
  b.set_boot_id(std::string(kMaxBootIdBytes, 'b'));
  b.mutable_node()->set_hostname(std::string(kMaxNodeNameBytes, 'h'));
  b.mutable_node()->set_nvml_error(std::string(kMaxNvmlErrorBytes, 'e'));
  v1::GpuSample* g = b.add_gpus();
  g->set_index(0);
  g->set_uuid(std::string(kMaxGpuTextBytes, 'u'));
  g->set_name(std::string(kMaxGpuTextBytes, 'g'));
  for (int i = 0; i < kMaxGpuPids; ++i) g->add_pids(i);
  b.mutable_host()->set_memory_bandwidth_source(std::string(kMaxHostTextBytes, 's'));
  ASSERT_OK(state.Apply(b));
  const int64_t plain = c.node + c.gpu + c.job + 2 * (c.rank_slot + c.rank);
  const int64_t accounted = state.MemoryAccountedBytes();
  // Node name, agent id, host name, NVML error, GPU strings and pids, job name, host source.
  const int64_t text = 6 * 257 + 257 + 257 + 257 + 4097 + 129 + 129 + 2 * 4 * kMaxGpuPids + 257 +
                       33 + 6 * 257 + 257 + 2 * (257 + 257);
  EXPECT_EQ(accounted - plain, text);
  // The same description again costs nothing more; a shorter one gives back the difference.
  b.set_seq(2);
  ASSERT_OK(state.Apply(b));
  EXPECT_EQ(state.MemoryAccountedBytes(), accounted);
  b.set_seq(3);
  b.mutable_node()->clear_nvml_error();
  b.clear_steps();
  ASSERT_OK(state.Apply(b));
  EXPECT_EQ(state.MemoryAccountedBytes(), accounted - 4097);
  // Everything forgotten: every charge returned.
  clock.AdvanceTime(absl::Seconds(61));
  state.Tick();
  EXPECT_EQ(state.MemoryAccountedBytes(), 0);
  state.Tick();
  EXPECT_TRUE(state.Snapshot().jobs.empty());
}

TEST(AdmissionTest, NewCountersOnMetrics) {
  StateSnapshot s;
  s.counters.node_refusals[{"node-b", "rank_foreign"}] = 4;
  s.counters.malformed["unparsable"] = 2;
  s.counters.fields_refused[{"boot_id", "too_long"}] = 3;
  s.counters.refused["no_identity"] = 5;
  s.counters.rank_takeovers = 6;
  s.counters.limit_hits["jobs_per_node"] = 7;
  s.counters.steps_rejected["foreign"] = 8;
  const std::vector<prometheus::MetricFamily> fams = BuildMetricFamilies(s, {});
  const auto value = [&](const std::string& name,
                         const std::vector<std::pair<std::string, std::string>>& labels) {
    for (const auto& f : fams) {
      if (f.name != name) continue;
      for (const auto& m : f.metric) {
        bool all = true;
        for (const auto& wanted : labels) {
          all = all && std::any_of(m.label.begin(), m.label.end(), [&](const auto& l) {
                  return l.name == wanted.first && l.value == wanted.second;
                });
        }
        if (all) return m.counter.value;
      }
    }
    return -1.0;
  };
  EXPECT_EQ(value("stepwatch_collector_node_refusals_total",
                  {{"node", "node-b"}, {"reason", "rank_foreign"}}),
            4);
  EXPECT_EQ(value("stepwatch_collector_malformed_batches_total", {{"reason", "unparsable"}}), 2);
  EXPECT_EQ(value("stepwatch_collector_malformed_batches_total", {{"reason", "bad_field"}}), 0);
  EXPECT_EQ(value("stepwatch_collector_fields_refused_total",
                  {{"field", "boot_id"}, {"reason", "too_long"}}),
            3);
  EXPECT_EQ(value("stepwatch_collector_requests_refused_total", {{"reason", "no_identity"}}), 5);
  EXPECT_EQ(value("stepwatch_collector_rank_takeovers_total", {}), 6);
  EXPECT_EQ(value("stepwatch_collector_limit_hits_total", {{"limit", "jobs_per_node"}}), 7);
  EXPECT_EQ(value("stepwatch_collector_steps_rejected_total", {{"reason", "foreign"}}), 8);
}

}  // namespace
}  // namespace stepwatch::collector
