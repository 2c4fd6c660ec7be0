// The routing decision of one cut, as a pure function: which collector link gets which steps,
// rank exits, node samples and job releases. CollectorRouter::Cut gathers the inputs under its
// locks, calls PlanCut, and queues the parts; nothing here touches a link, a clock or gRPC.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/collector_link.h"

namespace stepwatch::agent {

// Job -> the collectors that hold it.
using JobOwners = absl::flat_hash_map<std::string, std::vector<std::string>>;

struct CutPlanInput {
  // Every live link's address.
  std::vector<std::string> links;
  // The links a job may be placed on: the reachable ones, or all of them when none is.
  std::vector<std::string> candidates;
  // Collectors per job (capped at the number of candidates).
  int replicas = 1;
  // Jobs seen recently on this node (their owners draw the node's samples, and their moves are
  // tracked), and the owners each had at the previous cut (absent: new).
  std::vector<std::string> recent_jobs;
  JobOwners previous_owners;
  // Placement of the node's samples when no recent job has owners (NodePlacementKey).
  std::string node_key;
  // The cut carries a GPU and host sample for the node owners.
  bool with_samples = false;
};

struct JobMove {
  std::string job;
  std::vector<std::string> from, to;
};

struct CutPlan {
  // Each collector's part of the cut, steps in arrival order.
  std::map<std::string, CutContents> parts;
  // Recent jobs whose owners changed since the previous cut.
  std::vector<JobMove> moves;
  // The owners of every recent job now (the next cut's previous_owners).
  JobOwners owners;
  // The collectors this cut gave data to (a part that only releases jobs does not count).
  std::set<std::string> needed;
};

// Steps and rank exits go to the owners of their job (RendezvousOwners over `candidates`), the
// node samples to the union of the recent jobs' owners (or the node key's), and a job that left a
// reachable collector is released there in that collector's part. `cut` holds the whole cut:
// created_unix_nanos, node, steps, gpus, host and rank_exits.
CutPlan PlanCut(const CutPlanInput& in, CutContents cut);

}  // namespace stepwatch::agent
