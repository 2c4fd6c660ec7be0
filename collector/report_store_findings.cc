// The finding bookkeeping of job reports: how each snapshot of a running job merges into its
// report. A finding seen for the first time opens an entry, one seen again refreshes what may
// change while it lasts (severity, cause, evidence, pod), and one gone since the previous
// snapshot is closed at the job's last step. A report holds at most max_findings_per_report
// entries: the oldest cleared ones make room, and a finding that finds none is counted as
// dropped. The rest of the store (collector/report_store.cc) calls these under its lock.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/pod_index.h"
#include "collector/report_store.h"

namespace stepwatch::collector {
namespace {

// Keeps what changes while a finding lasts up to date; its identity and start stay.
void Refresh(const analysis::Finding& f, const FindingAttribution& attribute, v1::Finding* entry) {
  v1::Finding fresh;
  ToProto(f, &fresh);
  // The pod last known: a pod seen once stays in the report after the job's pods are gone.
  if (attribute) {
    const PodNames pod = attribute(f);
    if (!pod.empty()) SetKubernetesPod(pod, entry->mutable_kubernetes_pod());
  }
  entry->set_severity(fresh.severity());
  entry->set_summary(fresh.summary());
  entry->set_persistent(fresh.persistent());
  entry->set_cause(fresh.cause());
  *entry->mutable_causes() = fresh.causes();
  entry->set_action(fresh.action());
  *entry->mutable_ranks() = fresh.ranks();
  *entry->mutable_evidence() = fresh.evidence();
}

}  // namespace

void ReportStore::Update(Tracked* t, const analysis::JobSnapshot& job,
                         const std::vector<analysis::Finding>& active, const JobSpan& span,
                         int64_t now, const FindingAttribution& attribute) {
  v1::JobReport& r = t->report;
  if (job.world_size > 0) r.set_world_size(job.world_size);
  r.set_last_step(std::max(r.last_step(), job.last_step));
  if (span.first_step >= 0 && (r.first_step() < 0 || span.first_step < r.first_step())) {
    r.set_first_step(span.first_step);
  }
  if (r.start_unix_nanos() == 0)
    r.set_start_unix_nanos(span.start_unix_nanos > 0 ? span.start_unix_nanos : now);
  r.set_updated_unix_nanos(now);
  if (job.median_step_seconds > 0) r.set_step_seconds(job.median_step_seconds);
  // Unknown stays unknown: only a job that reported its split has these (and keeps the last).
  if (job.split_known) {
    r.set_efficiency_ratio(job.efficiency_ratio);
    auto& tr = *r.mutable_time_ratio();
    tr["compute"] = job.breakdown.compute;
    tr["imbalance"] = job.breakdown.imbalance;
    tr["comm"] = job.breakdown.comm;
    tr["data"] = job.breakdown.data;
    tr["other"] = job.breakdown.other;
    WhatIfToProto(job.whatif, r.mutable_whatif_speedup_ratio(), r.mutable_whatif_kind());
  }
  if (job.scaling_efficiency_ratio.has_value()) {
    r.set_scaling_efficiency_ratio(*job.scaling_efficiency_ratio);
  }
  // The last known sections: a job whose ranks stop reporting them keeps the ones it had.
  if (!job.section_names.empty()) {
    if (!std::equal(r.section_names().begin(), r.section_names().end(), job.section_names.begin(),
                    job.section_names.end())) {
      r.clear_section_names();
      for (const std::string& name : job.section_names) r.add_section_names(name);
    }
    r.set_sections_folded(std::max(r.sections_folded(), job.sections_folded));
  }

  absl::flat_hash_set<FindingKey> seen;
  for (const analysis::Finding& f : active) {
    if (f.job != job.job) continue;
    FindingKey key(analysis::FindingKindName(f.kind), f.rank, f.node, f.gpu, f.stage, f.device);
    auto found = t->active.find(key);
    if (found != t->active.end()) {
      if (found->second >= 0) Refresh(f, attribute, r.mutable_findings(found->second));
    } else {
      v1::Finding entry;
      ToProto(f, &entry);
      if (attribute) {
        const PodNames pod = attribute(f);
        if (!pod.empty()) SetKubernetesPod(pod, entry.mutable_kubernetes_pod());
      }
      entry.set_job(job.job);
      r.set_finding_count(r.finding_count() + 1);
      // A finding dropped for want of room is remembered (as -1) so it is counted only once.
      t->active[key] = Append(t, entry) ? r.findings_size() - 1 : -1;
    }
    seen.insert(std::move(key));
  }
  for (auto a = t->active.begin(); a != t->active.end();) {
    if (seen.contains(a->first)) {
      ++a;
      continue;
    }
    if (a->second >= 0) {
      v1::Finding* f = r.mutable_findings(a->second);
      f->set_until_step(r.last_step());
      f->set_until_unix_nanos(now);
    }
    t->active.erase(a++);
  }
}

bool ReportStore::Append(Tracked* t, const v1::Finding& f) {
  v1::JobReport& r = t->report;
  if (r.findings_size() >= std::max(1, options_.max_findings_per_report)) {
    int victim = -1;
    for (int i = 0; i < r.findings_size(); ++i) {
      if (r.findings(i).until_step() >= 0) {
        victim = i;
        break;
      }
    }
    r.set_findings_dropped(r.findings_dropped() + 1);
    if (victim < 0) return false;
    r.mutable_findings()->DeleteSubrange(victim, 1);
    for (auto& [key, index] : t->active) {
      if (index > victim) --index;
    }
  }
  *r.add_findings() = f;
  return true;
}

void ReportStore::CloseAll(Tracked* t, int64_t now) {
  for (const auto& [key, index] : t->active) {
    if (index < 0) continue;
    v1::Finding* f = t->report.mutable_findings(index);
    f->set_until_step(t->report.last_step());
    f->set_until_unix_nanos(now);
  }
  t->active.clear();
}

}  // namespace stepwatch::collector
