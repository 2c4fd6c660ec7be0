#include "collector/queries.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/pod_index.h"
#include "common/log.h"

namespace stepwatch::collector {
namespace {

// A finding as answered: with its Kubernetes pod when known.
void FindingToProto(const PublishedState& view, const GpuPodLookup& gpus,
                    const analysis::Finding& f, v1::Finding* out) {
  ToProto(f, out);
  const PodNames pod = AttributeFinding(f, view.snapshot.rank_pods.get(), gpus);
  if (!pod.empty()) SetKubernetesPod(pod, out->mutable_kubernetes_pod());
}

}  // namespace

v1::StatusResponse StatusAnswer(const PublishedState& view, int64_t max_answer_bytes) {
  v1::StatusResponse out;
  for (const analysis::JobSnapshot& job : view.snapshot.jobs) {
    auto it = view.findings_per_job.find(job.job);
    ToProto(job, it == view.findings_per_job.end() ? 0 : it->second, out.add_jobs());
  }
  // Jobs first; nodes while the answer stays under max_answer_bytes, so that it always fits the
  // gRPC send limit (the last nodes are left out, and logged, beyond it).
  size_t bytes = out.ByteSizeLong();
  size_t omitted = 0;
  for (const NodeSnapshot& n : view.snapshot.nodes) {
    if (bytes > static_cast<size_t>(std::max<int64_t>(0, max_answer_bytes))) {
      ++omitted;
      continue;
    }
    v1::NodeStatus* ns = out.add_nodes();
    ns->set_node(n.node);
    ns->set_agent_id(n.agent_id);
    ns->set_last_seen_unix_nanos(n.last_seen_unix_nanos);
    ns->set_nvml_available(n.info.nvml_available());
    ns->set_nvml_error(n.info.nvml_error());
    if (n.host.has_value() && n.host->has_cpu_utilization_ratio()) {
      ns->set_cpu_utilization_ratio(n.host->cpu_utilization_ratio());
    }
    for (const v1::GpuSample& g : n.gpus) {
      v1::GpuStatus* gs = ns->add_gpus();
      gs->set_index(g.index());
      gs->set_name(g.name());
      if (g.has_utilization_gpu_ratio()) gs->set_utilization_gpu_ratio(g.utilization_gpu_ratio());
      if (g.has_sm_activity_ratio()) gs->set_sm_activity_ratio(g.sm_activity_ratio());
      if (g.has_memory_used_bytes()) gs->set_memory_used_bytes(g.memory_used_bytes());
      if (g.has_memory_total_bytes()) gs->set_memory_total_bytes(g.memory_total_bytes());
      *gs->mutable_pids() = g.pids();
      if (g.has_kubernetes_pod()) *gs->mutable_kubernetes_pod() = g.kubernetes_pod();
    }
    bytes += ns->ByteSizeLong() + 8;  // and its tag and length
  }
  if (omitted > 0) {
    SW_LOG_WARNING << "status answer over " << (max_answer_bytes >> 20) << " MiB: " << omitted
                   << " of " << view.snapshot.nodes.size() << " nodes left out";
  }
  return out;
}

v1::FindingsResponse FindingsAnswer(const PublishedState& view, absl::string_view job,
                                    int64_t max_answer_bytes) {
  v1::FindingsResponse out;
  // Ordered by job, kind, rank: beyond max_answer_bytes the rest are left out (and logged).
  size_t bytes = 0;
  size_t omitted = 0;
  const GpuPodLookup gpus = GpuPodsOf(view.snapshot.nodes);
  for (const analysis::Finding& f : view.snapshot.findings) {
    if (!job.empty() && f.job != job) continue;
    if (bytes > static_cast<size_t>(std::max<int64_t>(0, max_answer_bytes))) {
      ++omitted;
      continue;
    }
    v1::Finding* out_f = out.add_findings();
    FindingToProto(view, gpus, f, out_f);
    bytes += out_f->ByteSizeLong() + 8;
  }
  if (omitted > 0) {
    SW_LOG_WARNING << "findings answer over " << (max_answer_bytes >> 20) << " MiB: " << omitted
                   << " findings left out";
  }
  return out;
}

absl::StatusOr<v1::ExplainResponse> ExplainAnswer(const PublishedState& view,
                                                  absl::string_view job) {
  v1::ExplainResponse out;
  const std::vector<analysis::JobSnapshot>& jobs = view.snapshot.jobs;
  // Jobs are ordered by name (the engine's registry is).
  auto snap = std::lower_bound(
      jobs.begin(), jobs.end(), job,
      [](const analysis::JobSnapshot& j, absl::string_view name) { return j.job < name; });
  if (snap == jobs.end() || snap->job != job) {
    return absl::NotFoundError(absl::StrCat("no job named \"", job, "\""));
  }
  int count = 0;
  const GpuPodLookup gpus = GpuPodsOf(view.snapshot.nodes);
  for (const analysis::Finding& f : view.snapshot.findings) {
    if (f.job != job) continue;
    ++count;
    FindingToProto(view, gpus, f, out.add_findings());
  }
  ToProto(*snap, count, out.mutable_job());
  // Unknown (no rank reported how its step splits) stays unknown: empty maps, not 100% compute.
  if (snap->split_known) {
    auto& tr = *out.mutable_time_ratio();
    tr["compute"] = snap->breakdown.compute;
    tr["imbalance"] = snap->breakdown.imbalance;
    tr["comm"] = snap->breakdown.comm;
    tr["data"] = snap->breakdown.data;
    tr["other"] = snap->breakdown.other;
    WhatIfToProto(snap->whatif, out.mutable_whatif_speedup_ratio(), out.mutable_whatif_kind());
  }
  if (snap->scaling_efficiency_ratio.has_value()) {
    out.set_scaling_efficiency_ratio(*snap->scaling_efficiency_ratio);
  }
  if (auto ranks = view.ranks.find(job); ranks != view.ranks.end()) {
    const PodIndex* pods = view.snapshot.rank_pods.get();
    for (const analysis::RankSnapshot& r : *ranks->second) {
      v1::RankRow* row = out.add_ranks();
      ToProto(r, row);
      const PodNames* pod = pods == nullptr ? nullptr : pods->OfRank(job, r.rank);
      if (pod != nullptr) SetKubernetesPod(*pod, row->mutable_kubernetes_pod());
    }
  }
  return out;
}

absl::Status ReportAnswer(const ReportStore& reports, absl::string_view job,
                          v1::ReportResponse* response) {
  if (job.empty()) {
    for (v1::JobReport& r : reports.List()) *response->add_reports() = std::move(r);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::JobReport> report = reports.Get(job);
  if (!report.ok()) return report.status();
  *response->mutable_report() = *std::move(report);
  return absl::OkStatus();
}

}  // namespace stepwatch::collector
