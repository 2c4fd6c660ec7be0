#include "ctl/merge.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace stepwatch::ctl {
namespace {

// The finding reported since the earlier step wins; on a tie the one seen first (the collector
// asked first).
bool WatchedLonger(const v1::Finding& a, const v1::Finding& b) {
  if (a.since_step() != b.since_step()) return a.since_step() < b.since_step();
  return a.since_unix_nanos() != 0 && a.since_unix_nanos() < b.since_unix_nanos();
}

// The findings of every list, deduplicated by identity, in the collector's order (job, kind,
// rank, then the rest of the identity).
std::vector<v1::Finding> UnionOfFindings(
    const std::vector<const google::protobuf::RepeatedPtrField<v1::Finding>*>& lists) {
  std::map<FindingIdentity, const v1::Finding*> by_identity;
  for (const auto* list : lists) {
    for (const v1::Finding& f : *list) {
      auto [it, inserted] = by_identity.emplace(IdentityOf(f), &f);
      if (!inserted && WatchedLonger(f, *it->second)) it->second = &f;
    }
  }
  std::vector<v1::Finding> out;
  out.reserve(by_identity.size());
  for (const auto& [identity, f] : by_identity) out.push_back(*f);
  // The map orders by (kind, job, ...); a collector lists by job, kind, rank.
  std::stable_sort(out.begin(), out.end(), [](const v1::Finding& a, const v1::Finding& b) {
    return std::make_tuple(a.job(), a.kind(), a.rank()) <
           std::make_tuple(b.job(), b.kind(), b.rank());
  });
  return out;
}

int64_t UntilOrForever(const v1::Finding& f) {
  return f.until_step() < 0 ? std::numeric_limits<int64_t>::max() : f.until_step();
}

}  // namespace

int EffectiveReplicas(int replicas_flag, size_t collector_count) {
  const int n = static_cast<int>(std::min<size_t>(collector_count, 1 << 20));
  return std::max(1, std::min(replicas_flag, n));
}

bool NewerJobStatus(const v1::JobStatus& a, const v1::JobStatus& b) {
  if (a.last_step() != b.last_step()) return a.last_step() > b.last_step();
  if (a.ranks_reporting() != b.ranks_reporting()) return a.ranks_reporting() > b.ranks_reporting();
  return a.last_seen_unix_nanos() > b.last_seen_unix_nanos();
}

FindingIdentity IdentityOf(const v1::Finding& f) {
  return {f.kind(), f.job(), f.rank(), f.node(), f.gpu(), f.stage(), f.cause()};
}

v1::StatusResponse MergeStatus(const std::vector<v1::StatusResponse>& answers) {
  if (answers.size() == 1) return answers[0];
  std::map<std::string, const v1::JobStatus*> jobs;
  std::map<std::string, const v1::NodeStatus*> nodes;
  for (const v1::StatusResponse& a : answers) {
    for (const v1::JobStatus& j : a.jobs()) {
      auto [it, inserted] = jobs.emplace(j.job(), &j);
      if (!inserted && NewerJobStatus(j, *it->second)) it->second = &j;
    }
    for (const v1::NodeStatus& n : a.nodes()) {
      auto [it, inserted] = nodes.emplace(n.node(), &n);
      if (!inserted && n.last_seen_unix_nanos() > it->second->last_seen_unix_nanos()) {
        it->second = &n;
      }
    }
  }
  v1::StatusResponse out;
  for (const auto& [name, j] : jobs) *out.add_jobs() = *j;
  for (const auto& [name, n] : nodes) *out.add_nodes() = *n;
  return out;
}

v1::FindingsResponse MergeFindings(const std::vector<v1::FindingsResponse>& answers) {
  if (answers.size() == 1) return answers[0];
  std::vector<const google::protobuf::RepeatedPtrField<v1::Finding>*> lists;
  lists.reserve(answers.size());
  for (const v1::FindingsResponse& a : answers) lists.push_back(&a.findings());
  v1::FindingsResponse out;
  for (v1::Finding& f : UnionOfFindings(lists)) *out.add_findings() = std::move(f);
  return out;
}

std::vector<v1::FindingsResponse> WithoutStaleReplicas(
    std::vector<v1::FindingsResponse> answers,
    const std::vector<const v1::StatusResponse*>& statuses) {
  std::map<std::string, int64_t> freshest;  // job -> newest last_seen of any replica
  for (const v1::StatusResponse* s : statuses) {
    if (s == nullptr) continue;
    for (const v1::JobStatus& j : s->jobs()) {
      int64_t& t = freshest[j.job()];
      t = std::max(t, j.last_seen_unix_nanos());
    }
  }
  for (size_t i = 0; i < answers.size() && i < statuses.size(); ++i) {
    if (statuses[i] == nullptr) continue;
    std::map<std::string, int64_t> seen;
    for (const v1::JobStatus& j : statuses[i]->jobs()) seen[j.job()] = j.last_seen_unix_nanos();
    auto* findings = answers[i].mutable_findings();
    for (int k = findings->size() - 1; k >= 0; --k) {
      auto it = seen.find(findings->Get(k).job());
      if (it != seen.end() && it->second < freshest[it->first] - kStaleReplicaNanos) {
        findings->DeleteSubrange(k, 1);
      }
    }
  }
  return answers;
}

v1::ExplainResponse MergeExplain(const std::vector<v1::ExplainResponse>& answers) {
  if (answers.empty()) return {};
  if (answers.size() == 1) return answers[0];
  const v1::ExplainResponse* newest = &answers[0];
  int64_t freshest = 0;
  for (const v1::ExplainResponse& a : answers) {
    if (NewerJobStatus(a.job(), newest->job())) newest = &a;
    freshest = std::max(freshest, a.job().last_seen_unix_nanos());
  }
  std::vector<const google::protobuf::RepeatedPtrField<v1::Finding>*> lists;
  for (const v1::ExplainResponse& a : answers) {
    if (a.job().last_seen_unix_nanos() < freshest - kStaleReplicaNanos) continue;
    lists.push_back(&a.findings());
  }
  v1::ExplainResponse out = *newest;
  out.clear_findings();
  for (v1::Finding& f : UnionOfFindings(lists)) *out.add_findings() = std::move(f);
  out.mutable_job()->set_finding_count(out.findings_size());
  return out;
}

v1::JobReport MergeReports(const std::vector<v1::JobReport>& reports) {
  if (reports.empty()) return {};
  if (reports.size() == 1) return reports[0];
  const v1::JobReport* newest = &reports[0];
  for (const v1::JobReport& r : reports) {
    if (r.updated_unix_nanos() > newest->updated_unix_nanos()) newest = &r;
  }
  v1::JobReport out = *newest;
  for (const v1::JobReport& r : reports) {
    if (r.first_step() >= 0 && (out.first_step() < 0 || r.first_step() < out.first_step())) {
      out.set_first_step(r.first_step());
    }
    if (r.start_unix_nanos() > 0 &&
        (out.start_unix_nanos() <= 0 || r.start_unix_nanos() < out.start_unix_nanos())) {
      out.set_start_unix_nanos(r.start_unix_nanos());
    }
    out.set_findings_dropped(std::max(out.findings_dropped(), r.findings_dropped()));
  }
  // Every finding once: the same identity over overlapping steps is one finding seen by two
  // replicas; the same identity later again is a new one (it cleared and came back).
  std::vector<const v1::Finding*> kept;
  for (const v1::Finding& f : newest->findings()) kept.push_back(&f);
  int added = 0;
  for (const v1::JobReport& r : reports) {
    if (&r == newest) continue;
    for (const v1::Finding& f : r.findings()) {
      bool seen = false;
      for (const v1::Finding*& k : kept) {
        if (IdentityOf(*k) != IdentityOf(f)) continue;
        if (f.since_step() > UntilOrForever(*k) || k->since_step() > UntilOrForever(f)) continue;
        seen = true;
        if (f.since_step() < k->since_step()) k = &f;  // the replica that saw it start
        break;
      }
      if (!seen) {
        kept.push_back(&f);
        ++added;
      }
    }
  }
  std::stable_sort(kept.begin(), kept.end(), [](const v1::Finding* a, const v1::Finding* b) {
    return a->since_step() < b->since_step();
  });
  out.clear_findings();
  for (const v1::Finding* f : kept) *out.add_findings() = *f;
  out.set_finding_count(newest->finding_count() + added);
  return out;
}

v1::ReportResponse MergeReportLists(const std::vector<v1::ReportResponse>& answers) {
  if (answers.size() == 1) return answers[0];
  std::map<std::string, const v1::JobReport*> by_job;
  for (const v1::ReportResponse& a : answers) {
    for (const v1::JobReport& r : a.reports()) {
      auto [it, inserted] = by_job.emplace(r.job(), &r);
      if (!inserted && r.updated_unix_nanos() > it->second->updated_unix_nanos()) it->second = &r;
    }
  }
  std::vector<const v1::JobReport*> rows;
  rows.reserve(by_job.size());
  for (const auto& [job, r] : by_job) rows.push_back(r);
  std::stable_sort(rows.begin(), rows.end(), [](const v1::JobReport* a, const v1::JobReport* b) {
    return a->updated_unix_nanos() > b->updated_unix_nanos();  // ties stay by name
  });
  v1::ReportResponse out;
  for (const v1::JobReport* r : rows) *out.add_reports() = *r;
  return out;
}

}  // namespace stepwatch::ctl
