#include "collector/state.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/collector/test_util.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

using ::stepwatch::test::StatusIs;

using testing::EmptyBatch;
using testing::StepBatch;

constexpr int64_t kSecond = 1'000'000'000;

uint64_t RejectedFor(const CollectorCounters& c, const std::string& reason) {
  auto it = c.steps_rejected.find(reason);
  return it == c.steps_rejected.end() ? 0 : it->second;
}
uint64_t LimitHits(const CollectorCounters& c, const std::string& limit) {
  auto it = c.limit_hits.find(limit);
  return it == c.limit_hits.end() ? 0 : it->second;
}

TEST(CollectorStateTest, AcksAndIgnoresDuplicateBatches) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  auto ack = state.Apply(StepBatch("n0", 1, "job", 2, 0, 0.1));
  ASSERT_OK(ack);
  EXPECT_EQ(ack->boot_id(), "boot-1");
  EXPECT_EQ(ack->acked_seq(), 1u);
  ack = state.Apply(StepBatch("n0", 2, "job", 2, 1, 0.1));
  ASSERT_OK(ack);
  EXPECT_EQ(ack->acked_seq(), 2u);
  // Resent after a reconnect: acknowledged again, its steps not counted twice.
  ack = state.Apply(StepBatch("n0", 1, "job", 2, 0, 0.1));
  ASSERT_OK(ack);
  EXPECT_EQ(ack->acked_seq(), 2u);
  state.Tick();  // readers see what the last Tick published
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.counters.batches_received, 3u);
  EXPECT_EQ(s.counters.duplicate_batches, 1u);
  EXPECT_EQ(s.counters.steps_received, 4u);
}

TEST(CollectorStateTest, RejectsBatchWithoutIdentity) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  v1::ReportBatch b = EmptyBatch("n0", 1);
  b.clear_agent_id();
  EXPECT_EQ(state.Apply(b).status().code(), absl::StatusCode::kInvalidArgument);
  b = EmptyBatch("n0", 0);
  EXPECT_EQ(state.Apply(b).status().code(), absl::StatusCode::kInvalidArgument);
  state.Tick();
  EXPECT_EQ(state.Snapshot().counters.ingest_errors, 2u);
}

TEST(CollectorStateTest, InvalidStepsAreCountedNotFatal) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  v1::ReportBatch b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  b.mutable_steps(0)->set_rank(7);  // rank >= world_size
  ASSERT_OK(state.Apply(b));
  state.Tick();
  EXPECT_EQ(RejectedFor(state.Snapshot().counters, "invalid"), 1u);
}

TEST(CollectorStateTest, JobRankAndNodeLimitsAreCounted) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.engine.max_jobs = 1;
  o.engine.max_ranks_per_job = 2;
  o.max_nodes = 1;
  o.max_gpus_per_node = 1;
  CollectorState state(o, &clock);
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "a", 2, 0, 0.1)));
  ASSERT_OK(state.Apply(StepBatch("n0", 2, "a", 3, 1, 0.1)));  // world size 3 > 2
  ASSERT_OK(state.Apply(StepBatch("n0", 3, "b", 1, 0, 0.1)));  // job b over the limit
  v1::ReportBatch gpus = EmptyBatch("n0", 4);
  gpus.add_gpus()->set_index(0);
  gpus.add_gpus()->set_index(1);  // over the GPU limit
  ASSERT_OK(state.Apply(gpus));
  ASSERT_OK(state.Apply(EmptyBatch("n1", 1)));  // node n1 over the limit
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(LimitHits(s.counters, "ranks_per_job"), 3u);
  EXPECT_EQ(LimitHits(s.counters, "jobs"), 1u);
  EXPECT_EQ(LimitHits(s.counters, "gpus_per_node"), 1u);
  EXPECT_EQ(LimitHits(s.counters, "nodes"), 1u);
  EXPECT_EQ(RejectedFor(s.counters, "limit"), 4u);
  EXPECT_EQ(RejectedFor(s.counters, "invalid"), 0u);
  EXPECT_EQ(state.Status().jobs_size(), 1);
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].node, "n0");
  EXPECT_EQ(s.nodes[0].gpus.size(), 1u);
}

// An operator who hits the node limit learns it from the log at the first refusal, with the flag
// to raise; the default covers 20,000 nodes.
TEST(CollectorStateTest, FirstNodeLimitRefusalLogsAWarningNamingTheFlag) {
  EXPECT_EQ(CollectorStateOptions{}.max_nodes, 20000);
  SimulatedClock clock;
  CollectorStateOptions o;
  o.max_nodes = 2;
  CollectorState state(o, &clock);
  ASSERT_OK(state.Apply(EmptyBatch("n0", 1)));
  ASSERT_OK(state.Apply(EmptyBatch("n1", 1)));
  ::testing::internal::CaptureStderr();
  ASSERT_OK(state.Apply(EmptyBatch("n2", 1)));  // the first node over the limit
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find(" W "), std::string::npos) << log;
  EXPECT_NE(log.find("limit nodes of 2 reached"), std::string::npos) << log;
  EXPECT_NE(log.find("--max-nodes"), std::string::npos) << log;
}

TEST(CollectorStateTest, StatusListsJobsAndNodesWithGpusInIndexOrder) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  v1::ReportBatch b = StepBatch("n0", 1, "job", 4, 0, 0.1);
  for (int index : {3, 1, 2, 0}) {
    v1::GpuSample* g = b.add_gpus();
    g->set_index(index);
    g->set_utilization_gpu_ratio(index / 10.0);
    g->add_pids(100 + index);
  }
  b.mutable_host()->set_cpu_utilization_ratio(0.25);
  ASSERT_OK(state.Apply(b));
  // A later sample of GPU 2 replaces the first.
  v1::ReportBatch later = EmptyBatch("n0", 2);
  later.add_gpus()->set_index(2);
  later.mutable_gpus(0)->set_utilization_gpu_ratio(0.9);
  ASSERT_OK(state.Apply(later));

  state.Tick();
  v1::StatusResponse status = state.Status();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).job(), "job");
  EXPECT_EQ(status.jobs(0).world_size(), 4);
  ASSERT_EQ(status.nodes_size(), 1);
  const v1::NodeStatus& n = status.nodes(0);
  EXPECT_EQ(n.node(), "n0");
  EXPECT_EQ(n.agent_id(), "agent-n0");
  EXPECT_EQ(n.last_seen_unix_nanos(), clock.NowUnixNanos());
  EXPECT_DOUBLE_EQ(n.cpu_utilization_ratio(), 0.25);
  ASSERT_EQ(n.gpus_size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(n.gpus(i).index(), i);
  EXPECT_DOUBLE_EQ(n.gpus(1).utilization_gpu_ratio(), 0.1);
  EXPECT_DOUBLE_EQ(n.gpus(2).utilization_gpu_ratio(), 0.9);
  EXPECT_EQ(n.gpus(3).pids(0), 103u);
}

TEST(CollectorStateTest, ExpiresJobsAndNodesUnseenForExpire) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.expire_nanos = 60 * kSecond;
  CollectorState state(o, &clock);
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "old", 2, 0, 0.1)));
  clock.AdvanceTime(absl::Seconds(40));
  ASSERT_OK(state.Apply(StepBatch("n1", 1, "young", 2, 0, 0.1)));
  clock.AdvanceTime(absl::Seconds(30));  // "old" and n0 unseen for 70 s, "young" and n1 for 30 s
  state.Tick();
  v1::StatusResponse status = state.Status();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).job(), "young");
  ASSERT_EQ(status.nodes_size(), 1);
  EXPECT_EQ(status.nodes(0).node(), "n1");
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.counters.expired.at("job"), 1u);
  EXPECT_EQ(s.counters.expired.at("node"), 1u);
  // An expired agent's sequence state is forgotten too: it is welcome back from seq 1.
  auto ack = state.Apply(StepBatch("n0", 1, "old", 2, 1, 0.1));
  ASSERT_OK(ack);
  state.Tick();
  EXPECT_EQ(state.Snapshot().counters.duplicate_batches, 0u);
}

v1::RankExit Exit(const std::string& job, int rank, int pid = 4321) {
  v1::RankExit x;
  x.set_job(job);
  x.set_rank(rank);
  x.set_pid(pid);
  return x;
}

uint64_t Refused(const CollectorCounters& c, const std::string& reason) {
  auto it = c.refused.find(reason);
  return it == c.refused.end() ? 0 : it->second;
}

// The job moved to other collectors (a failover ended): once the agents of all its nodes released
// it, it is forgotten here, with no report kept and no stall raised; a node that never reported
// the job cannot release it.
TEST(CollectorStateTest, JobReleasedByTheAgentsOfAllItsNodesIsForgottenWithoutAStall) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.engine.stall_floor = absl::Seconds(5);
  o.engine.stall_multiple = 2;
  CollectorState state(o, &clock);
  uint64_t seq = 0;
  for (int step = 0; step < 20; ++step) {
    ASSERT_OK(state.Apply(StepBatch("n0", ++seq, "moved", 2, step, 0.1)));
    ASSERT_OK(state.Apply(StepBatch("n0", ++seq, "stays", 2, step, 0.1)));
    clock.AdvanceTime(absl::Milliseconds(200));
  }
  state.Tick();
  ASSERT_EQ(state.Status().jobs_size(), 2);
  v1::ReportBatch foreign = EmptyBatch("n1", 1);
  foreign.add_released_jobs("moved");
  ASSERT_OK(state.Apply(foreign));
  state.Tick();
  ASSERT_EQ(state.Status().jobs_size(), 2);
  v1::ReportBatch released = EmptyBatch("n0", ++seq);
  released.add_released_jobs("moved");
  released.add_released_jobs("never-seen");
  ASSERT_OK(state.Apply(released));
  state.Tick();
  const v1::StatusResponse status = state.Status();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).job(), "stays");
  EXPECT_EQ(state.Snapshot().counters.jobs_moved_away, 1u);
  EXPECT_EQ(state.Snapshot().counters.jobs_finished, 0u);
  EXPECT_THAT(state.reports().Get("moved"), StatusIs(absl::StatusCode::kNotFound));
  // Long past the stall floor: the job that stays stalls, the one that moved does not.
  clock.AdvanceTime(absl::Seconds(10));
  state.Tick();
  const v1::FindingsResponse findings = state.Findings("");
  ASSERT_EQ(findings.findings_size(), 1);
  EXPECT_EQ(findings.findings(0).job(), "stays");
  EXPECT_EQ(findings.findings(0).kind(), "stall");
}

TEST(CollectorStateTest, ANodeCannotEndRanksItNeverReported) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "job", 2, 0, 0.1)));
  v1::ReportBatch forged = EmptyBatch("n1", 1);
  *forged.add_rank_exits() = Exit("job", 0);
  *forged.add_rank_exits() = Exit("job", 1);
  ASSERT_OK(state.Apply(forged));
  v1::ReportBatch no_pid = EmptyBatch("n0", 2);
  *no_pid.add_rank_exits() = Exit("job", 0, /*pid=*/0);
  *no_pid.add_rank_exits() = Exit("job", 1, /*pid=*/0);
  ASSERT_OK(state.Apply(no_pid));
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(Refused(s.counters, "rank_exit_foreign"), 4u);
  EXPECT_EQ(s.counters.jobs_finished, 0u);
  EXPECT_EQ(state.Status().jobs_size(), 1);
}

TEST(CollectorStateTest, TimestampsFarFromTheCollectorClockAreReplaced) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.max_clock_skew_nanos = 30 * kSecond;
  CollectorState state(o, &clock);
  uint64_t seq = 0;
  // A node an hour fast: its stamps would move the engine's "now" an hour ahead, expiring every
  // other job's pending steps before their ranks arrive.
  v1::ReportBatch fast = StepBatch("fast", 1, "fast-job", 4, 0, 0.1);
  for (v1::StepEvent& e : *fast.mutable_steps()) {
    e.set_received_unix_nanos(clock.NowUnixNanos() + 3600 * kSecond);
  }
  ASSERT_OK(state.Apply(fast));
  state.Tick();
  EXPECT_EQ(state.Snapshot().counters.clock_skew_corrected, 4u);
  // Another job's ranks arrive one batch each, as through different agents: still one step.
  for (int step = 0; step < 40; ++step) {
    for (int rank = 0; rank < 4; ++rank) {
      v1::ReportBatch b = StepBatch("n0", ++seq, "slow-job", 4, step, 0.1, 2, 0.13);
      v1::StepEvent e = b.steps(rank);
      b.clear_steps();
      e.set_received_unix_nanos(clock.NowUnixNanos());
      *b.add_steps() = e;
      ASSERT_OK(state.Apply(b));
    }
    clock.AdvanceTime(absl::Milliseconds(100));
  }
  state.Tick();
  const v1::FindingsResponse findings = state.Findings("slow-job");
  ASSERT_EQ(findings.findings_size(), 1);
  EXPECT_EQ(findings.findings(0).kind(), "straggler");
  EXPECT_EQ(findings.findings(0).rank(), 2);
}

// Found by fuzz_collector_apply: the skew of INT64_MIN from the collector's clock overflowed, so
// the stamp passed as "close enough" (and UBSan stopped the collector).
TEST(CollectorStateTest, ExtremeTimestampsAreReplacedWithoutOverflow) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  v1::ReportBatch b = StepBatch("n0", 1, "job", 2, 0, 0.1);
  b.mutable_steps(0)->set_received_unix_nanos(INT64_MIN);
  b.mutable_steps(1)->set_received_unix_nanos(INT64_MAX);
  v1::GpuSample* gpu = b.add_gpus();
  gpu->set_index(0);
  gpu->set_sampled_unix_nanos(INT64_MIN);
  ASSERT_OK(state.Apply(b));
  state.Tick();
  const StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.counters.clock_skew_corrected, 3u);
  EXPECT_EQ(s.counters.steps_received, 2u);
}

TEST(CollectorStateTest, NamesWithControlCharactersAreRefused) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "evil\x1b[2J", 2, 0, 0.1)));
  ASSERT_OK(state.Apply(StepBatch("n0", 2, std::string(300, 'j'), 2, 0, 0.1)));
  state.Tick();
  EXPECT_EQ(RejectedFor(state.Snapshot().counters, "invalid"), 4u);
  EXPECT_EQ(state.Status().jobs_size(), 0);
  EXPECT_EQ(state.Apply(StepBatch("node\x07", 1, "job", 2, 0, 0.1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CollectorStateTest, JobWhoseRanksAllExitedIsForgottenWithoutAStall) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.engine.stall_floor = absl::Seconds(5);
  o.engine.stall_multiple = 2;
  CollectorState state(o, &clock);
  uint64_t seq = 0;
  for (int step = 0; step < 20; ++step) {
    ASSERT_OK(state.Apply(StepBatch("n0", ++seq, "done", 2, step, 0.1)));
    ASSERT_OK(state.Apply(StepBatch("n0", ++seq, "hung", 2, step, 0.1)));
    clock.AdvanceTime(absl::Milliseconds(200));
  }
  state.Tick();
  ASSERT_EQ(state.Status().jobs_size(), 2);
  // Both ranks of "done" exited; one rank of "hung" did, the other hangs on.
  v1::ReportBatch exits = EmptyBatch("n0", ++seq);
  *exits.add_rank_exits() = Exit("done", 0);
  *exits.add_rank_exits() = Exit("done", 1);
  *exits.add_rank_exits() = Exit("hung", 1);
  ASSERT_OK(state.Apply(exits));
  ASSERT_OK(state.Apply(exits));  // resent: ignored as a duplicate
  state.Tick();
  v1::StatusResponse status = state.Status();
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).job(), "hung");
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.counters.rank_exits_received, 3u);
  EXPECT_EQ(s.counters.jobs_finished, 1u);
  EXPECT_EQ(s.counters.expired.count("job"), 0u);
  clock.AdvanceTime(absl::Seconds(10));
  state.Tick();
  const v1::FindingsResponse findings = state.Findings("");
  ASSERT_EQ(findings.findings_size(), 1);
  EXPECT_EQ(findings.findings(0).kind(), "stall");
  EXPECT_EQ(findings.findings(0).job(), "hung");
  EXPECT_NE(findings.findings(0).summary().find("rank 1 exited"), std::string::npos)
      << findings.findings(0).summary();
  EXPECT_THAT(state.Explain("done"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(CollectorStateTest, StragglerReachesFindingsAndExplain) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  // 8 ranks; rank 5 computes 60% longer than the others for 60 steps.
  for (int step = 0; step < 60; ++step) {
    ASSERT_OK(state.Apply(StepBatch("n0", step + 1, "job", 8, step, 0.1, 5, 0.16)));
    clock.AdvanceTime(absl::Milliseconds(200));
    state.Tick();
  }
  v1::FindingsResponse findings = state.Findings("job");
  auto is_rank5 = [](const v1::Finding& f) { return f.kind() == "straggler" && f.rank() == 5; };
  EXPECT_TRUE(std::any_of(findings.findings().begin(), findings.findings().end(), is_rank5))
      << findings.DebugString();
  EXPECT_EQ(state.Findings("other-job").findings_size(), 0);

  absl::StatusOr<v1::ExplainResponse> explain = state.Explain("job");
  ASSERT_OK(explain);
  EXPECT_EQ(explain->job().world_size(), 8);
  EXPECT_EQ(explain->job().last_step(), 59);
  EXPECT_GT(explain->job().finding_count(), 0);
  ASSERT_EQ(explain->ranks_size(), 8);
  for (const v1::RankRow& r : explain->ranks()) {
    EXPECT_EQ(r.straggler(), r.rank() == 5) << r.DebugString();
  }
  EXPECT_EQ(explain->time_ratio().size(), 5u);
  EXPECT_GT(explain->time_ratio().at("imbalance"), 0);
  EXPECT_GT(explain->whatif_speedup_ratio().at("stragglers"), 1.0);
  EXPECT_EQ(state.Explain("nope").status().code(), absl::StatusCode::kNotFound);
  // /metrics gets the slowest ranks first, at most top_ranks_per_job of them.
  StateSnapshot snap = state.Snapshot();
  ASSERT_EQ(snap.top_ranks.size(), 5u);
  EXPECT_EQ(snap.top_ranks[0].first, "job");
  EXPECT_EQ(snap.top_ranks[0].second.rank, 5);
  EXPECT_GT(snap.top_ranks[0].second.busy_vs_median_ratio, 1.3);
  // The engine's per-detector timings reach the snapshot that /metrics is built from.
  ASSERT_TRUE(snap.detector_timings.count("straggler") == 1);
  EXPECT_GT(snap.detector_timings.at("straggler").runs, 0);
  EXPECT_TRUE(snap.detector_timings.count("gpu_utilization") == 1);
}

// One set of limits, the engine's: 100,000 ranks per job by default.
TEST(CollectorStateTest, RanksPerJobLimitIsTheEnginesDefault) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  v1::ReportBatch b = StepBatch("n0", 1, "big", 1, 0, 0.1);
  b.mutable_steps(0)->set_world_size(100'000);
  *b.add_steps() = b.steps(0);
  b.mutable_steps(1)->set_job("bigger");
  b.mutable_steps(1)->set_world_size(100'001);
  ASSERT_OK(state.Apply(b));
  state.Tick();
  const StateSnapshot s = state.Snapshot();
  ASSERT_EQ(s.jobs.size(), 1u);
  EXPECT_EQ(s.jobs[0].job, "big");
  EXPECT_EQ(s.jobs[0].world_size, 100'000);
  EXPECT_EQ(LimitHits(s.counters, "ranks_per_job"), 1u);
}

TEST(CollectorStateTest, LimitRefusalsAreLoggedOnceNamingTheFlag) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.engine.max_jobs = 1;
  CollectorState state(o, &clock);
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "a", 1, 0, 0.1)));
  ::testing::internal::CaptureStderr();
  for (uint64_t seq = 2; seq < 6; ++seq) {
    ASSERT_OK(state.Apply(StepBatch("n0", seq, "b" + std::to_string(seq), 1, 0, 0.1)));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string line = "limit jobs of 1 reached";
  const size_t first = log.find(line);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(line, first + 1), std::string::npos) << "logged more than once: " << log;
  EXPECT_NE(log.find("--max-jobs"), std::string::npos) << log;
  state.Tick();
  EXPECT_EQ(LimitHits(state.Snapshot().counters, "jobs"), 4u);
}

// A reader holding a published state keeps it as it was, whatever ingest and later ticks do.
TEST(CollectorStateTest, PublishedStateDoesNotChangeAfterItIsPublished) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  ASSERT_NE(state.Published(), nullptr);  // an empty view before the first Tick
  EXPECT_TRUE(state.Published()->snapshot.jobs.empty());
  ASSERT_OK(state.Apply(StepBatch("n0", 1, "job", 4, 0, 0.1)));
  state.Tick();
  const std::shared_ptr<const PublishedState> held = state.Published();
  ASSERT_EQ(held->snapshot.jobs.size(), 1u);
  const int64_t last_step = held->snapshot.jobs[0].last_step;
  const uint64_t steps = held->snapshot.counters.steps_received;
  const size_t ranks = held->ranks.at("job")->size();
  for (uint64_t seq = 2; seq < 12; ++seq) {
    ASSERT_OK(state.Apply(StepBatch("n0", seq, "job", 4, seq, 0.1)));
    ASSERT_OK(state.Apply(StepBatch("n1", seq, "job-" + std::to_string(seq), 8, 0, 0.1)));
    clock.AdvanceTime(absl::Seconds(1));
    state.Tick();
  }
  EXPECT_EQ(state.Published()->snapshot.jobs.size(), 11u);
  EXPECT_NE(state.Published(), held);
  EXPECT_EQ(held->snapshot.jobs.size(), 1u);
  EXPECT_EQ(held->snapshot.jobs[0].last_step, last_step);
  EXPECT_EQ(held->snapshot.counters.steps_received, steps);
  EXPECT_EQ(held->snapshot.nodes.size(), 1u);
  EXPECT_EQ(held->ranks.size(), 1u);
  EXPECT_EQ(held->ranks.at("job")->size(), ranks);
}

// Readers answer from the published state while ingest holds its mutex (as a long Apply does).
TEST(CollectorStateTest, ReadersDoNotWaitForTheIngestLock) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  for (int step = 0; step < 30; ++step) {
    ASSERT_OK(state.Apply(StepBatch("n0", step + 1, "job", 8, step, 0.1, 5, 0.16)));
    clock.AdvanceTime(absl::Milliseconds(200));
  }
  state.Tick();
  absl::Notification answered;
  int jobs = -1;
  int ranks = -1;
  size_t snapshot_jobs = 0;
  std::thread reader;
  bool returned = false;
  state.RunWithIngestLockHeldForTest([&] {
    reader = std::thread([&] {
      jobs = state.Status().jobs_size();
      state.Findings("");
      absl::StatusOr<v1::ExplainResponse> explain = state.Explain("job");
      ranks = explain.ok() ? explain->ranks_size() : -1;
      snapshot_jobs = state.Snapshot().jobs.size();
      answered.Notify();
    });
    // Bounded: a reader that took the ingest mutex would still be blocked when this returns.
    returned = answered.WaitForNotificationWithTimeout(absl::Seconds(20));
  });
  reader.join();
  EXPECT_TRUE(returned) << "a reader waited for the ingest mutex";
  EXPECT_EQ(jobs, 1);
  EXPECT_EQ(ranks, 8);
  EXPECT_EQ(snapshot_jobs, 1u);
}

// What ingest changes reaches readers at the next Tick, not before (counters excepted).
TEST(CollectorStateTest, JobsAndFindingsAppearAtTheNextTick) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  state.Tick();
  for (int step = 0; step < 60; ++step) {
    ASSERT_OK(state.Apply(StepBatch("n0", step + 1, "job", 8, step, 0.1, 5, 0.16)));
    clock.AdvanceTime(absl::Milliseconds(200));
  }
  EXPECT_EQ(state.Status().jobs_size(), 0);
  EXPECT_EQ(state.Findings("job").findings_size(), 0);
  EXPECT_EQ(state.Explain("job").status().code(), absl::StatusCode::kNotFound);
  // Counters are not held back: a scrape counts every batch applied.
  EXPECT_EQ(state.Snapshot().counters.steps_received, 480u);
  state.Tick();
  EXPECT_EQ(state.Status().jobs_size(), 1);
  const v1::FindingsResponse findings = state.Findings("job");
  EXPECT_TRUE(std::any_of(findings.findings().begin(), findings.findings().end(),
                          [](const v1::Finding& f) { return f.kind() == "straggler"; }))
      << findings.DebugString();
  EXPECT_OK(state.Explain("job"));
  EXPECT_EQ(state.Snapshot().counters.steps_received, 480u);
}

TEST(CollectorStateTest, ScalingHistoryRoundTrips) {
  SimulatedClock clock;
  CollectorState a({}, &clock);
  for (int step = 0; step < 40; ++step) {
    ASSERT_OK(a.Apply(StepBatch("n0", step + 1, "job", 4, step, 0.1)));
    clock.AdvanceTime(absl::Milliseconds(100));
  }
  a.Tick();
  const std::string saved = a.SerializeScalingHistory();
  CollectorState b({}, &clock);
  EXPECT_OK(b.LoadScalingHistory(saved));
  EXPECT_EQ(b.SerializeScalingHistory(), saved);
}

}  // namespace
}  // namespace stepwatch::collector
