// The routing decision of a cut without links, streams or clocks: PlanCut's parts per collector.
#include "agent/cut_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/collectors.h"

namespace stepwatch::agent {
namespace {

const std::vector<std::string> kCollectors = {"10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"};

v1::StepEvent Step(const std::string& job, int64_t step) {
  v1::StepEvent e;
  e.set_job(job);
  e.set_step(step);
  return e;
}

v1::RankExit Exit(const std::string& job) {
  v1::RankExit x;
  x.set_job(job);
  return x;
}

CutPlanInput Input(int replicas, std::vector<std::string> recent) {
  CutPlanInput in;
  in.links = kCollectors;
  in.candidates = kCollectors;
  in.replicas = replicas;
  in.recent_jobs = std::move(recent);
  in.node_key = NodePlacementKey("node-a");
  in.with_samples = true;
  return in;
}

CutContents Cut(std::vector<v1::StepEvent> steps, std::vector<v1::RankExit> exits = {}) {
  CutContents c;
  c.created_unix_nanos = 42;
  c.node.set_node("node-a");
  c.steps = std::move(steps);
  c.rank_exits = std::move(exits);
  c.gpus.resize(2);
  c.host = v1::HostSample();
  return c;
}

std::vector<int64_t> StepsOf(const CutContents& c) {
  std::vector<int64_t> out;
  for (const v1::StepEvent& e : c.steps) out.push_back(e.step());
  return out;
}

TEST(CutPlanTest, StepsExitsAndSamplesGoToTheOwners) {
  const std::vector<std::string> a = RendezvousOwners("job-a", kCollectors, 2);
  const std::vector<std::string> b = RendezvousOwners("job-b", kCollectors, 2);
  const CutPlan plan =
      PlanCut(Input(2, {"job-a", "job-b"}),
              Cut({Step("job-a", 1), Step("job-b", 2), Step("job-a", 3)}, {Exit("job-b")}));
  std::set<std::string> node_owners(a.begin(), a.end());
  node_owners.insert(b.begin(), b.end());
  for (const std::string& c : kCollectors) {
    const auto it = plan.parts.find(c);
    const bool holds_a = std::find(a.begin(), a.end(), c) != a.end();
    const bool holds_b = std::find(b.begin(), b.end(), c) != b.end();
    if (!holds_a && !holds_b) {
      EXPECT_EQ(it, plan.parts.end()) << c;
      continue;
    }
    ASSERT_NE(it, plan.parts.end()) << c;
    const CutContents& p = it->second;
    std::vector<int64_t> want;
    // Arrival order, each job's steps only where it is held.
    if (holds_a) want.push_back(1);
    if (holds_b) want.push_back(2);
    if (holds_a) want.push_back(3);
    EXPECT_EQ(StepsOf(p), want) << c;
    EXPECT_EQ(p.rank_exits.size(), holds_b ? 1u : 0u) << c;
    EXPECT_EQ(p.gpus.size(), 2u) << c;  // every owner of a recent job gets the samples
    EXPECT_TRUE(p.host.has_value()) << c;
    EXPECT_EQ(p.created_unix_nanos, 42) << c;
    EXPECT_EQ(p.node.node(), "node-a") << c;
    EXPECT_TRUE(p.released_jobs.empty()) << c;
  }
  EXPECT_EQ(plan.needed, node_owners);
  EXPECT_TRUE(plan.moves.empty());
  EXPECT_EQ(plan.owners.at("job-a"), a);
  EXPECT_EQ(plan.owners.at("job-b"), b);
}

TEST(CutPlanTest, WithoutRecentJobsTheNodeKeyPlacesTheSamples) {
  CutPlanInput in = Input(1, {});
  const std::vector<std::string> node = RendezvousOwners(in.node_key, kCollectors, 1);
  CutPlan plan = PlanCut(in, Cut({}));
  ASSERT_EQ(plan.parts.size(), 1u);
  EXPECT_EQ(plan.parts.begin()->first, node[0]);
  EXPECT_EQ(plan.parts.begin()->second.gpus.size(), 2u);
  EXPECT_EQ(plan.needed, std::set<std::string>({node[0]}));

  // A cut without samples (shutdown) carries only steps, and needs only their owners.
  in.with_samples = false;
  plan = PlanCut(in, Cut({}));
  EXPECT_TRUE(plan.parts.empty());
  EXPECT_TRUE(plan.needed.empty());
}

TEST(CutPlanTest, JobsBeyondTheRecentBoundArePlacedButDrawNoSamples) {
  const std::vector<std::string> x = RendezvousOwners("job-x", kCollectors, 1);
  CutPlanInput in = Input(1, {});
  const std::vector<std::string> node = RendezvousOwners(in.node_key, kCollectors, 1);
  const CutPlan plan = PlanCut(in, Cut({Step("job-x", 7)}));
  EXPECT_EQ(StepsOf(plan.parts.at(x[0])), std::vector<int64_t>({7}));
  EXPECT_EQ(plan.parts.at(node[0]).gpus.size(), 2u);
  EXPECT_FALSE(plan.owners.contains("job-x"));
}

TEST(CutPlanTest, AMovedJobIsReleasedOnlyWhereItLeftAReachableCollector) {
  const std::vector<std::string> now = RendezvousOwners("job-m", kCollectors, 1);
  std::vector<std::string> others;
  for (const std::string& c : kCollectors) {
    if (c != now[0]) others.push_back(c);
  }
  // Held by the two others before: one is reachable (told), one is not (a candidate no more).
  CutPlanInput in = Input(1, {"job-m"});
  in.previous_owners["job-m"] = others;
  in.candidates = {now[0], others[0]};
  const std::vector<std::string> placed = RendezvousOwners("job-m", in.candidates, 1);
  ASSERT_EQ(placed, now);  // the order among the candidates left is the same
  const CutPlan plan = PlanCut(in, Cut({Step("job-m", 1)}));
  ASSERT_EQ(plan.moves.size(), 1u);
  EXPECT_EQ(plan.moves[0].job, "job-m");
  EXPECT_EQ(plan.moves[0].from, others);
  EXPECT_EQ(plan.moves[0].to, now);
  EXPECT_EQ(plan.parts.at(others[0]).released_jobs, std::vector<std::string>({"job-m"}));
  EXPECT_TRUE(plan.parts.at(others[0]).steps.empty());
  EXPECT_EQ(plan.parts.count(others[1]), 0u);
  EXPECT_EQ(StepsOf(plan.parts.at(now[0])), std::vector<int64_t>({1}));
  // A part that only releases a job is not data the collector must hold.
  EXPECT_EQ(plan.needed, std::set<std::string>({now[0]}));
  EXPECT_EQ(plan.owners.at("job-m"), now);
}

}  // namespace
}  // namespace stepwatch::agent
