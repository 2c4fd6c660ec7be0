#include "ctl/merge.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stepwatch::ctl {
namespace {

using ::testing::ElementsAre;

v1::JobStatus Job(const std::string& name, int64_t last_step, int32_t ranks_reporting = 8,
                  int64_t last_seen = 1000) {
  v1::JobStatus j;
  j.set_job(name);
  j.set_world_size(8);
  j.set_ranks_reporting(ranks_reporting);
  j.set_last_step(last_step);
  j.set_last_seen_unix_nanos(last_seen);
  return j;
}

v1::NodeStatus Node(const std::string& name, int64_t last_seen, const std::string& agent = "") {
  v1::NodeStatus n;
  n.set_node(name);
  n.set_agent_id(agent);
  n.set_last_seen_unix_nanos(last_seen);
  return n;
}

v1::Finding Finding(const std::string& kind, const std::string& job, int32_t rank,
                    int64_t since_step, const std::string& summary = "") {
  v1::Finding f;
  f.set_kind(kind);
  f.set_job(job);
  f.set_rank(rank);
  f.set_node(rank >= 0 ? "node-1" : "");
  f.set_gpu(-1);
  f.set_stage(-1);
  f.set_cause("unknown");
  f.set_since_step(since_step);
  f.set_until_step(-1);
  f.set_summary(summary);
  return f;
}

std::vector<std::string> JobNames(const v1::StatusResponse& s) {
  std::vector<std::string> out;
  for (const auto& j : s.jobs()) out.push_back(j.job());
  return out;
}

TEST(EffectiveReplicasTest, CappedByTheCollectorsAndAtLeastOne) {
  EXPECT_EQ(EffectiveReplicas(2, 3), 2);
  EXPECT_EQ(EffectiveReplicas(2, 1), 1);
  EXPECT_EQ(EffectiveReplicas(5, 3), 3);
  EXPECT_EQ(EffectiveReplicas(0, 3), 1);
}

TEST(NewerJobStatusTest, LastStepThenRanksReportingThenLastSeen) {
  EXPECT_TRUE(NewerJobStatus(Job("a", 11, 1, 1), Job("a", 10, 8, 9)));
  EXPECT_FALSE(NewerJobStatus(Job("a", 10, 8, 9), Job("a", 11, 1, 1)));
  EXPECT_TRUE(NewerJobStatus(Job("a", 10, 8, 1), Job("a", 10, 4, 9)));
  EXPECT_TRUE(NewerJobStatus(Job("a", 10, 8, 9), Job("a", 10, 8, 1)));
  EXPECT_FALSE(NewerJobStatus(Job("a", 10, 8, 9), Job("a", 10, 8, 9)));
}

TEST(MergeStatusTest, OneAnswerIsReturnedAsItIs) {
  v1::StatusResponse one;
  *one.add_jobs() = Job("zeta", 1);
  *one.add_jobs() = Job("alpha", 1);  // not re-sorted
  *one.add_nodes() = Node("n2", 5);
  const v1::StatusResponse merged = MergeStatus({one});
  EXPECT_EQ(merged.SerializeAsString(), one.SerializeAsString());
}

TEST(MergeStatusTest, UnionOfJobsAndNodesTheNewerReplicaWins) {
  v1::StatusResponse a, b, c;
  *a.add_jobs() = Job("only-a", 3);
  *a.add_jobs() = Job("shared", 41, 8, 2000);
  *b.add_jobs() = Job("shared", 42, 6, 1000);  // a later step wins over more ranks, later seen
  *b.add_jobs() = Job("only-b", 7);
  *c.add_jobs() = Job("also-c", 1);
  *a.add_nodes() = Node("node-1", 100, "agent-old");
  *b.add_nodes() = Node("node-1", 200, "agent-new");
  *b.add_nodes() = Node("node-0", 50);
  const v1::StatusResponse merged = MergeStatus({a, b, c});
  EXPECT_THAT(JobNames(merged), ElementsAre("also-c", "only-a", "only-b", "shared"));
  EXPECT_EQ(merged.jobs(3).last_step(), 42);
  EXPECT_EQ(merged.jobs(3).ranks_reporting(), 6);
  ASSERT_EQ(merged.nodes_size(), 2);
  EXPECT_EQ(merged.nodes(0).node(), "node-0");
  EXPECT_EQ(merged.nodes(1).node(), "node-1");
  EXPECT_EQ(merged.nodes(1).agent_id(), "agent-new");
}

TEST(MergeStatusTest, TheOrderOfTheAnswersDoesNotMatter) {
  v1::StatusResponse a, b;
  *a.add_jobs() = Job("shared", 10, 8, 5);
  *b.add_jobs() = Job("shared", 10, 3, 9);  // same step, fewer ranks: the fuller view wins
  for (const auto& merged : {MergeStatus({a, b}), MergeStatus({b, a})}) {
    ASSERT_EQ(merged.jobs_size(), 1);
    EXPECT_EQ(merged.jobs(0).ranks_reporting(), 8);
  }
}

TEST(IdentityOfTest, EveryIdentityFieldCounts) {
  const v1::Finding base = Finding("straggler", "j", 3, 10);
  std::vector<v1::Finding> changed(7, base);
  changed[0].set_kind("slow_node");
  changed[1].set_job("k");
  changed[2].set_rank(4);
  changed[3].set_node("node-2");
  changed[4].set_gpu(1);
  changed[5].set_stage(0);
  changed[6].set_cause("thermal_throttling");
  for (const v1::Finding& f : changed) EXPECT_NE(IdentityOf(f), IdentityOf(base));
  v1::Finding same = base;  // not part of the identity
  same.set_since_step(99);
  same.set_summary("other words");
  same.set_severity("critical");
  same.set_persistent(true);
  EXPECT_EQ(IdentityOf(same), IdentityOf(base));
}

TEST(MergeFindingsTest, DeduplicatedByIdentityKeepingTheEarlierStart) {
  v1::FindingsResponse a, b;
  *a.add_findings() = Finding("straggler", "j1", 3, 20, "seen by a");
  *a.add_findings() = Finding("straggler", "j1", 5, 20, "only a");
  *b.add_findings() = Finding("straggler", "j1", 3, 12, "seen by b first");
  *b.add_findings() = Finding("stall", "j0", -1, 4, "only b");
  v1::Finding other_cause = Finding("straggler", "j1", 3, 25, "another cause");
  other_cause.set_cause("thermal_throttling");
  *b.add_findings() = other_cause;
  const v1::FindingsResponse merged = MergeFindings({a, b});
  std::vector<std::string> summaries;
  for (const auto& f : merged.findings()) summaries.push_back(f.summary());
  // Ordered by job, kind, rank (as one collector lists them), then the rest of the identity;
  // both causes of rank 3 kept.
  EXPECT_THAT(summaries, ElementsAre("only b", "another cause", "seen by b first", "only a"));
}

TEST(MergeFindingsTest, OneAnswerIsReturnedAsItIs) {
  v1::FindingsResponse a;
  *a.add_findings() = Finding("straggler", "j1", 3, 20);
  *a.add_findings() = Finding("straggler", "j1", 3, 20);  // even a duplicate stays
  EXPECT_EQ(MergeFindings({a}).findings_size(), 2);
}

TEST(MergeExplainTest, NewestFiguresAndEveryFindingOnce) {
  v1::ExplainResponse old_replica, new_replica;
  *old_replica.mutable_job() = Job("j", 40);
  old_replica.mutable_job()->set_finding_count(2);
  (*old_replica.mutable_time_ratio())["compute"] = 0.5;
  old_replica.add_ranks()->set_rank(0);
  *old_replica.add_findings() = Finding("straggler", "j", 3, 10, "old");
  *old_replica.add_findings() = Finding("straggler", "j", 5, 30, "rank 5");
  *new_replica.mutable_job() = Job("j", 45);
  new_replica.mutable_job()->set_finding_count(1);
  (*new_replica.mutable_time_ratio())["compute"] = 0.7;
  new_replica.add_ranks()->set_rank(0);
  new_replica.add_ranks()->set_rank(1);
  *new_replica.add_findings() = Finding("straggler", "j", 3, 20, "new");
  const v1::ExplainResponse merged = MergeExplain({old_replica, new_replica});
  EXPECT_EQ(merged.job().last_step(), 45);
  EXPECT_DOUBLE_EQ(merged.time_ratio().at("compute"), 0.7);
  EXPECT_EQ(merged.ranks_size(), 2);
  ASSERT_EQ(merged.findings_size(), 2);
  EXPECT_EQ(merged.findings(0).summary(), "old");  // active since the earlier step
  EXPECT_EQ(merged.findings(1).summary(), "rank 5");
  EXPECT_EQ(merged.job().finding_count(), 2);
}

// A job that moved back after a failover: the collector that held it meanwhile still shows its
// last findings, 20 s behind the replicas that receive the job.
TEST(WithoutStaleReplicasTest, FindingsOfAJobThatMovedAwayAreLeftOut) {
  constexpr int64_t kNow = 1'000'000'000'000;
  constexpr int64_t kSec = 1'000'000'000;
  v1::StatusResponse fresh, stale;
  *fresh.add_jobs() = Job("moved", 100, 8, kNow);
  *fresh.add_jobs() = Job("other", 50, 8, kNow - 60 * kSec);  // quiet, but nobody is newer
  *stale.add_jobs() = Job("moved", 60, 8, kNow - 20 * kSec);
  *stale.add_jobs() = Job("other", 50, 8, kNow - 61 * kSec);
  v1::FindingsResponse from_fresh, from_stale, unknown_status;
  *from_fresh.add_findings() = Finding("straggler", "moved", 3, 70);
  *from_stale.add_findings() = Finding("stall", "moved", -1, 60);
  *from_stale.add_findings() = Finding("straggler", "other", 1, 40);
  *unknown_status.add_findings() = Finding("stall", "moved", -1, 60);
  const std::vector<v1::FindingsResponse> kept =
      WithoutStaleReplicas({from_fresh, from_stale, unknown_status}, {&fresh, &stale, nullptr});
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].findings_size(), 1);
  // The stale stall goes; a job within 15 s of the freshest replica keeps its findings.
  ASSERT_EQ(kept[1].findings_size(), 1);
  EXPECT_EQ(kept[1].findings(0).job(), "other");
  // Without that collector's status nothing is known to be stale.
  EXPECT_EQ(kept[2].findings_size(), 1);
}

TEST(MergeExplainTest, AStaleReplicasFindingsAreLeftOut) {
  constexpr int64_t kSec = 1'000'000'000;
  v1::ExplainResponse current, stale;
  *current.mutable_job() = Job("j", 100, 8, 100 * kSec);
  *current.add_findings() = Finding("straggler", "j", 3, 70);
  *stale.mutable_job() = Job("j", 60, 8, 80 * kSec);
  *stale.add_findings() = Finding("stall", "j", -1, 60);
  const v1::ExplainResponse merged = MergeExplain({stale, current});
  ASSERT_EQ(merged.findings_size(), 1);
  EXPECT_EQ(merged.findings(0).kind(), "straggler");
  EXPECT_EQ(merged.job().finding_count(), 1);
}

v1::JobReport Report(const std::string& job, int64_t updated, int64_t first_step, int64_t start) {
  v1::JobReport r;
  r.set_job(job);
  r.set_state("running");
  r.set_updated_unix_nanos(updated);
  r.set_first_step(first_step);
  r.set_last_step(100);
  r.set_start_unix_nanos(start);
  return r;
}

TEST(MergeReportsTest, LifeSpanOfAllAndOverlappingFindingsOnce) {
  // The job moved: `before` has its start, `after` its latest figures.
  v1::JobReport before = Report("j", 100, 0, 1000);
  v1::JobReport after = Report("j", 200, 50, 5000);
  after.set_step_seconds(0.25);
  v1::Finding early = Finding("straggler", "j", 3, 5, "cleared early");
  early.set_until_step(20);
  v1::Finding ongoing_before = Finding("straggler", "j", 3, 40, "ongoing, seen first");
  *before.add_findings() = early;
  *before.add_findings() = ongoing_before;
  before.set_finding_count(2);
  *after.add_findings() = Finding("straggler", "j", 3, 55, "ongoing, seen later");
  after.set_finding_count(1);
  const v1::JobReport merged = MergeReports({after, before});
  EXPECT_DOUBLE_EQ(merged.step_seconds(), 0.25);
  EXPECT_EQ(merged.first_step(), 0);
  EXPECT_EQ(merged.start_unix_nanos(), 1000);
  std::vector<std::string> summaries;
  for (const auto& f : merged.findings()) summaries.push_back(f.summary());
  EXPECT_THAT(summaries, ElementsAre("cleared early", "ongoing, seen first"));
  EXPECT_EQ(merged.finding_count(), 2);
}

TEST(MergeReportListsTest, OneRowPerJobNewestFirst) {
  v1::ReportResponse a, b;
  *a.add_reports() = Report("x", 300, 0, 1);
  *a.add_reports() = Report("y", 100, 0, 1);
  *b.add_reports() = Report("y", 250, 0, 1);
  *b.add_reports() = Report("w", 250, 0, 1);
  const v1::ReportResponse merged = MergeReportLists({a, b});
  std::vector<std::string> rows;
  for (const auto& r : merged.reports()) rows.push_back(r.job());
  EXPECT_THAT(rows, ElementsAre("x", "w", "y"));
  EXPECT_EQ(merged.reports(2).updated_unix_nanos(), 250);
}

}  // namespace
}  // namespace stepwatch::ctl
