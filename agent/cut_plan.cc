#include "agent/cut_plan.h"

#include <algorithm>
#include <utility>

#include "common/collectors.h"

namespace stepwatch::agent {
namespace {

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Owners of every recent job, the moves since the previous cut, and the node samples' owners.
void PlaceRecentJobs(const CutPlanInput& in, CutPlan* plan, std::set<std::string>* node_owners) {
  for (const std::string& job : in.recent_jobs) {
    std::vector<std::string> o = RendezvousOwners(job, in.candidates, in.replicas);
    node_owners->insert(o.begin(), o.end());
    auto prev = in.previous_owners.find(job);
    if (prev != in.previous_owners.end() && prev->second != o) {
      plan->moves.push_back({job, prev->second, o});
    }
    plan->owners.emplace(job, std::move(o));
  }
  if (node_owners->empty()) {
    for (std::string& a : RendezvousOwners(in.node_key, in.candidates, in.replicas)) {
      node_owners->insert(std::move(a));
    }
  }
}

}  // namespace

CutPlan PlanCut(const CutPlanInput& in, CutContents cut) {
  CutPlan plan;
  std::set<std::string> node_owners;
  PlaceRecentJobs(in, &plan, &node_owners);
  // Jobs beyond the recent bound are placed too, but neither draw samples nor count as moved.
  JobOwners owners = plan.owners;
  auto owners_of = [&](const std::string& job) -> const std::vector<std::string>& {
    auto it = owners.find(job);
    if (it == owners.end()) {
      it = owners.emplace(job, RendezvousOwners(job, in.candidates, in.replicas)).first;
    }
    return it->second;
  };
  auto part = [&](const std::string& address) -> CutContents& {
    auto [it, inserted] = plan.parts.try_emplace(address);
    if (inserted) {
      it->second.created_unix_nanos = cut.created_unix_nanos;
      it->second.node = cut.node;
    }
    return it->second;
  };
  for (v1::StepEvent& e : cut.steps) {
    const std::vector<std::string>& o = owners_of(e.job());
    if (o.empty()) continue;
    // Copies for all owners but the last, which takes the event itself.
    for (size_t i = 0; i + 1 < o.size(); ++i) part(o[i]).steps.push_back(e);
    part(o.back()).steps.push_back(std::move(e));
  }
  for (const v1::RankExit& x : cut.rank_exits) {
    for (const std::string& a : owners_of(x.job())) part(a).rank_exits.push_back(x);
  }
  if (in.with_samples) {
    for (const std::string& a : node_owners) {
      CutContents& p = part(a);
      p.gpus = cut.gpus;
      p.host = cut.host;
    }
  }
  for (const auto& [address, contents] : plan.parts) plan.needed.insert(address);
  if (in.with_samples) plan.needed.insert(node_owners.begin(), node_owners.end());
  // A reachable collector a job left (it went back to a collector that returned, or the list
  // changed) stops expecting this node's ranks of it. An unreachable one is not told: if it
  // returns, the job comes back to it and goes on with its history.
  for (const JobMove& m : plan.moves) {
    for (const std::string& a : m.from) {
      if (Contains(m.to, a) || !Contains(in.links, a) || !Contains(in.candidates, a)) continue;
      part(a).released_jobs.push_back(m.job);
    }
  }
  return plan;
}

}  // namespace stepwatch::agent
