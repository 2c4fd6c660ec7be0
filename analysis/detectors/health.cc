#include "analysis/detectors/health.h"

#include <algorithm>
#include <set>
#include <utility>

#include "analysis/health_tracker.h"

namespace stepwatch::analysis {
namespace {

constexpr size_t kJobsShown = 8;

// One finding from the faults of one GPU or one port (most severe first).
Finding FromFaults(FindingKind kind, const std::vector<const HealthFault*>& faults) {
  Finding f;
  f.kind = kind;
  f.severity = faults[0]->severity;
  f.cause = faults[0]->cause;
  f.since_unix_nanos = faults[0]->since_unix_nanos;
  for (const HealthFault* x : faults) {
    if (std::find(f.causes.begin(), f.causes.end(), x->cause) == f.causes.end()) {
      f.causes.push_back(x->cause);
    }
    f.since_unix_nanos = std::min(f.since_unix_nanos, x->since_unix_nanos);
    f.evidence.health.push_back(x->evidence);
  }
  // A fault that has lasted since before the finding's first evaluation is not transient.
  f.persistent = true;
  return f;
}

}  // namespace

std::vector<std::string> JobsOnNode(const Registry& registry, const std::string& node) {
  std::set<std::string> jobs;
  if (const auto* ranks = registry.RanksOn(node)) {
    for (const auto& [job, rank] : *ranks) {
      jobs.insert(job);
      if (jobs.size() >= kJobsShown) break;
    }
  }
  return {jobs.begin(), jobs.end()};
}

void GpuHealthDetector::EvaluateGpu(const EngineView& view, const GpuInfo& g, const DetectorState*,
                                    std::vector<Finding>* out) const {
  const std::vector<HealthFault>& faults = g.health.faults();
  if (faults.empty()) return;
  std::vector<const HealthFault*> all;
  all.reserve(faults.size());
  for (const HealthFault& x : faults) all.push_back(&x);
  Finding f = FromFaults(FindingKind::kGpuHealth, all);
  f.node = g.last.node;
  f.gpu = g.last.index;
  f.job = g.job;
  f.rank = g.rank;
  if (g.rank >= 0) f.ranks = {g.rank};
  if (!g.job.empty()) {
    if (const JobRecord* job = view.registry.FindJob(g.job)) f.since_step = job->max_step;
  }
  f.evidence.jobs_at_risk = JobsOnNode(view.registry, f.node);
  out->push_back(std::move(f));
}

void NicHealthDetector::EvaluateHost(const EngineView& view, const std::string& node,
                                     const HostInfo& host, std::vector<Finding>* out) const {
  const std::vector<HealthFault>& faults = host.nics.faults();
  if (faults.empty()) return;
  // Ports in the order of their most severe fault (the faults are sorted so).
  std::vector<std::string> ports;
  for (const HealthFault& x : faults) {
    if (std::find(ports.begin(), ports.end(), x.device) == ports.end()) ports.push_back(x.device);
  }
  const std::vector<std::string> jobs = JobsOnNode(view.registry, node);
  for (const std::string& port : ports) {
    std::vector<const HealthFault*> of_port;
    for (const HealthFault& x : faults) {
      if (x.device == port) of_port.push_back(&x);
    }
    Finding f = FromFaults(FindingKind::kNicHealth, of_port);
    f.node = node;
    f.device = port;
    f.evidence.jobs_at_risk = jobs;
    out->push_back(std::move(f));
  }
}

}  // namespace stepwatch::analysis
