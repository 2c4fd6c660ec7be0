#include "analysis/detectors/gpu_utilization.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/causes.h"
#include "analysis/finding.h"
#include "analysis/stats.h"

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
  const bool fresh = now - g.last.sampled_unix_nanos <= opt.underutil_window_nanos;
  if (!st.flagged && fresh && now - st.below_since >= opt.underutil_window_nanos) {
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
  const double secs = (g.last.sampled_unix_nanos - st.below_since) / kNanosPerSecond;
  const char* what = g.last.sm_activity_ratio ? "SM activity" : "utilization";
  if (g.job.empty()) {
    f.kind = FindingKind::kIdleGpu;
    f.severity = Severity::kInfo;
    f.summary = absl::StrFormat("%s GPU %d: no process, %s %s for %.0f s (idle capacity)", f.node,
                                f.gpu, what, Percent(g.value), secs);
    SetCause(&f, Cause::kNoWork);
    f.action = absl::StrCat("schedule work on ", f.node, " GPU ", f.gpu, " or release it");
    out->push_back(std::move(f));
    return;
  }
  f.kind = FindingKind::kUnderutilizedGpu;
  f.job = g.job;
  f.rank = g.rank;
  if (g.rank >= 0) f.ranks = {g.rank};
  f.summary =
      absl::StrFormat("%s GPU %d (rank %d): %s %s < %s for %.0f s; ", f.node, f.gpu, g.rank, what,
                      Percent(g.value), Percent(view.options.underutil_threshold), secs);
  Attribute(view, g, &f);
  out->push_back(std::move(f));
}

// Appends the cause to the summary and sets cause and action.
void GpuUtilizationDetector::Attribute(const EngineView& view, const GpuInfo& g, Finding* f) {
  const EngineOptions& opt = view.options;
  auto set = [f](Cause c, const std::string& text, const std::string& action) {
    SetCause(f, c);
    absl::StrAppend(&f->summary, text);
    f->action = action;
  };
  const auto& hosts = view.registry.hosts();
  auto hit = hosts.find(g.last.node);
  if (hit != hosts.end() && hit->second.cpu_utilization_ratio &&
      *hit->second.cpu_utilization_ratio >= opt.host_cpu_saturated) {
    return set(
        Cause::kHostCpu,
        absl::StrCat("host CPU bound (CPU ", Percent(*hit->second.cpu_utilization_ratio), ")"),
        absl::StrCat("find what loads ", g.last.node,
                     "'s CPUs (input preprocessing, other processes): more CPU cores per "
                     "GPU or lighter preprocessing"));
  }
  const GpuReading& x = g.last;
  if (x.dram_bandwidth_ratio && *x.dram_bandwidth_ratio >= opt.memory_bound_dram_ratio &&
      x.sm_activity_ratio && *x.sm_activity_ratio < opt.underutil_threshold) {
    return set(
        Cause::kMemoryBandwidth,
        absl::StrCat("memory-bandwidth bound (DRAM bandwidth ", Percent(*x.dram_bandwidth_ratio),
                     ", SM activity ", Percent(*x.sm_activity_ratio), ")"),
        "profile the kernels: fuse memory-bound operations or raise arithmetic "
        "intensity (larger batch, mixed precision)");
  }
  const std::string release = "check whether the job is idle or hung; release the GPU if idle";
  const JobRecord* job = view.registry.FindJob(g.job);
  if (job == nullptr) return set(Cause::kNoWork, "no work", release);
  if (job->summaries.empty() ||
      x.sampled_unix_nanos - job->last_seen_nanos > opt.underutil_window_nanos) {
    return set(Cause::kNoWork, "no work: the job reports no steps", release);
  }
  JobSnapshot s;
  FillWindowFigures(job->summaries, &s);
  if (s.breakdown.data >= opt.data_bound_share) {
    return set(
        Cause::kDataLoading,
        absl::StrCat("waiting for input data (data ", Percent(s.breakdown.data), " of the step)"),
        DeviceAction(Cause::kDataLoading, g.last.node, g.last.index));
  }
  if (s.breakdown.comm + s.breakdown.imbalance >= opt.comm_bound_share) {
    const Cause c =
        s.breakdown.comm >= s.breakdown.imbalance ? Cause::kExposedComm : Cause::kImbalance;
    return set(c,
               absl::StrCat("communication bound (exposed communication and waiting ",
                            Percent(s.breakdown.comm + s.breakdown.imbalance), " of the step)"),
               JobAction(c));
  }
  return set(Cause::kUnknown,
             "cause unclear: the step split shows little waiting (small kernels or "
             "launch-bound)",
             "profile a step: small kernels or launch overhead (larger batch, CUDA graphs)");
}

}  // namespace stepwatch::analysis
