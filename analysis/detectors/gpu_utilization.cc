#include "analysis/detectors/gpu_utilization.h"

#include <algorithm>
#include <string>

#include "absl/time/time.h"
#include "analysis/causes.h"
#include "analysis/finding.h"
#include "analysis/ring.h"
#include "analysis/stats.h"
#include "analysis/window.h"

namespace stepwatch::analysis {

std::unique_ptr<DetectorState> GpuUtilizationDetector::NewGpuState() const {
  return std::make_unique<GpuUtilizationState>();
}

void GpuUtilizationDetector::OnGpu(const EngineView& view, const GpuInfo& g, DetectorState* state) {
  OnAdvanceGpu(view, g, g.last.sampled_unix_nanos, state);
}

void GpuUtilizationDetector::OnAdvanceGpu(const EngineView& view, const GpuInfo& g, int64_t now,
                                          DetectorState* state) {
  auto& st = *static_cast<GpuUtilizationState*>(state);
  const EngineOptions& opt = view.options;
  const bool tracked = !g.job.empty() || g.last.pids.empty();
  if (!g.has_value || !tracked || g.value >= opt.underutil_threshold) {
    st.below_since = -1;
    st.flagged = false;
    return;
  }
  if (st.below_since < 0) {
    st.below_since = g.last.sampled_unix_nanos;
    st.since_step = 0;
    if (!g.job.empty()) {
      if (const JobRecord* job = view.registry.FindJob(g.job)) {
        st.since_step = std::max<int64_t>(0, job->max_step);
      }
    }
  }
  // Readings that stopped arriving prove nothing about the present.
  const int64_t window = absl::ToInt64Nanoseconds(opt.underutil_window);
  const bool fresh = now - g.last.sampled_unix_nanos <= window;
  if (!st.flagged && fresh && now - st.below_since >= window) {
    st.flagged = true;
    st.flagged_since_nanos = st.below_since;
  }
}

void GpuUtilizationDetector::OnGpuReleased(const EngineView&, const GpuInfo&,
                                           DetectorState* state) {
  auto& st = *static_cast<GpuUtilizationState*>(state);
  st.flagged = false;
  st.below_since = -1;
}

void GpuUtilizationDetector::EvaluateGpu(const EngineView& view, const GpuInfo& g,
                                         const DetectorState* state,
                                         std::vector<Finding>* out) const {
  const auto& st = *static_cast<const GpuUtilizationState*>(state);
  if (!st.flagged) return;
  Finding f;
  f.node = g.last.node;
  f.gpu = g.last.index;
  f.since_unix_nanos = st.flagged_since_nanos;
  f.since_step = st.since_step;
  f.evidence.below_threshold_seconds =
      (g.last.sampled_unix_nanos - st.below_since) / kNanosPerSecond;
  f.evidence.utilization_threshold_ratio = view.options.underutil_threshold;
  DeviceEvidence dev;
  dev.rank = g.rank;
  dev.node = f.node;
  dev.gpu = f.gpu;
  SetGpuBusy(g, &dev);
  if (g.job.empty()) {
    f.kind = FindingKind::kIdleGpu;
    f.severity = Severity::kInfo;
    SetCause(&f, Cause::kNoWork);
    f.evidence.devices.push_back(std::move(dev));
    out->push_back(std::move(f));
    return;
  }
  f.kind = FindingKind::kUnderutilizedGpu;
  f.job = g.job;
  f.rank = g.rank;
  if (g.rank >= 0) f.ranks = {g.rank};
  SetCause(&f, Attribute(view, g, &f.evidence, &dev));
  f.evidence.devices.push_back(std::move(dev));
  out->push_back(std::move(f));
}

// Why the GPU is underutilized, with the figures that show it.
Cause GpuUtilizationDetector::Attribute(const EngineView& view, const GpuInfo& g, Evidence* e,
                                        DeviceEvidence* dev) {
  const EngineOptions& opt = view.options;
  const auto& hosts = view.registry.hosts();
  auto hit = hosts.find(g.last.node);
  if (hit != hosts.end() && hit->second.last.cpu_utilization_ratio &&
      *hit->second.last.cpu_utilization_ratio >= opt.host_cpu_saturated) {
    dev->host_cpu_ratio = hit->second.last.cpu_utilization_ratio;
    return Cause::kHostCpu;
  }
  const GpuSample& x = g.last;
  if (x.dram_bandwidth_ratio && *x.dram_bandwidth_ratio >= opt.memory_bound_dram_ratio &&
      x.sm_activity_ratio && *x.sm_activity_ratio < opt.underutil_threshold) {
    dev->dram_bandwidth_ratio = x.dram_bandwidth_ratio;
    return Cause::kMemoryBandwidth;
  }
  const JobRecord* job = view.registry.FindJob(g.job);
  if (job == nullptr || job->summaries.empty() ||
      absl::Nanoseconds(x.sampled_unix_nanos - job->last_seen_nanos) > opt.underutil_window) {
    return Cause::kNoWork;
  }
  JobSnapshot s;
  FillWindowFigures(job->summaries, &s);
  e->data_share_ratio = s.breakdown.data;
  e->comm_share_ratio = s.breakdown.comm;
  e->imbalance_share_ratio = s.breakdown.imbalance;
  if (s.breakdown.data >= opt.data_bound_share) return Cause::kDataLoading;
  if (s.breakdown.comm + s.breakdown.imbalance >= opt.comm_bound_share) {
    return s.breakdown.comm >= s.breakdown.imbalance ? Cause::kExposedComm : Cause::kImbalance;
  }
  return Cause::kUnknown;
}

}  // namespace stepwatch::analysis
