#include "collector/report_store.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace stepwatch::collector {

ReportStore::ReportStore(ReportStoreOptions options) : options_(std::move(options)) {}

ReportStore::~ReportStore() { Flush(); }

int64_t ReportStore::TimelineBytes(const v1::JobReport& r) {
  return r.has_timeline() ? static_cast<int64_t>(r.timeline().SpaceUsedLong()) : 0;
}

void ReportStore::Observe(const analysis::JobSnapshot& job,
                          const std::vector<analysis::Finding>& active, const JobSpan& span,
                          int64_t now, const FindingAttribution& attribute) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(job.job);
  if (it == running_.end()) {
    it = running_.emplace(job.job, Tracked{}).first;
    it->second.timeline = JobTimeline(options_.timeline);
    v1::JobReport& r = it->second.report;
    r.set_job(job.job);
    r.set_state("running");
    r.set_first_step(-1);
    r.set_last_step(-1);
    running_to_delete_.erase(job.job);
  }
  Tracked& t = it->second;
  if (t.recovered) {
    // Seen again after a restart: the gap closes at the first step this process saw.
    t.recovered = false;
    v1::ReportGap* gap = t.report.mutable_gaps(t.report.gaps_size() - 1);
    gap->set_before_step(span.first_step >= 0 ? span.first_step : job.last_step);
    gap->set_to_unix_nanos(now);
  }
  Update(&t, job, active, span, now, attribute);
}

void ReportStore::Finish(const analysis::JobSnapshot& job,
                         const std::vector<analysis::Finding>& active, const JobSpan& span,
                         absl::string_view reason, int64_t now,
                         const FindingAttribution& attribute) {
  Observe(job, active, span, now, attribute);
  absl::MutexLock lock(&mu_);
  auto it = running_.find(job.job);
  Tracked& t = it->second;
  CloseAll(&t, now);
  t.report.set_state("finished");
  t.report.set_end_reason(std::string(reason));
  t.report.set_end_unix_nanos(now);
  t.report.set_updated_unix_nanos(now);
  // Its last steps ran when it was last seen (an expired job was silent since).
  EndTimeline(&t, job.last_seen_unix_nanos > 0 ? std::min(job.last_seen_unix_nanos, now) : now);
  v1::JobReport report = std::move(t.report);
  running_.erase(it);
  running_to_delete_.insert(job.job);
  KeepFinished(std::move(report));
}

void ReportStore::EndTimeline(Tracked* t, int64_t last_seen) {
  if (t->timeline.empty()) return;
  t->timeline.Close(t->report.last_step(), last_seen);
  t->timeline.ToProto(t->report.mutable_timeline());
  t->timeline = JobTimeline(options_.timeline);
}

v1::JobReport ReportStore::WithTimeline(const Tracked& t) const {
  v1::JobReport r = t.report;
  if (!t.timeline.empty()) t.timeline.ToProto(r.mutable_timeline());
  return r;
}

void ReportStore::SampleTimelines(const PublishedState& view, int64_t now, int64_t room) {
  if (!options_.timeline.enabled) return;
  struct Due {
    const analysis::JobSnapshot* job;
    const std::vector<analysis::RankSnapshot>* ranks;
    int max_rank_rows;
    TimelineSample sample;
  };
  std::vector<Due> due;
  {
    absl::MutexLock lock(&mu_);
    for (const analysis::JobSnapshot& job : view.snapshot.jobs) {
      auto t = running_.find(job.job);
      auto rows = view.ranks.find(job.job);
      if (t == running_.end() || rows == view.ranks.end() || rows->second == nullptr) continue;
      if (!t->second.timeline.Due(job.last_step, now)) continue;
      due.push_back({&job, rows->second.get(), t->second.timeline.options().max_rank_rows, {}});
    }
  }
  // The pass over every rank of each job, outside the lock: Finish (under the collector's ingest
  // mutex) never waits for it.
  for (Due& d : due) {
    d.sample = MakeTimelineSample(*d.job, *d.ranks, view.snapshot.nodes, d.max_rank_rows, now);
  }
  absl::MutexLock lock(&mu_);
  for (const Due& d : due) {
    auto t = running_.find(d.job->job);
    // Finished or moved away meanwhile, or sampled by another caller.
    if (t == running_.end() || !t->second.timeline.Due(d.sample.last_step, now)) continue;
    JobTimeline& timeline = t->second.timeline;
    const int64_t growth = timeline.BytesWith(d.sample) - timeline.bytes();
    if (growth > room) {
      uint64_t suppressed = 0;
      if (timeline_log_limiter_.Allow(&suppressed)) {
        SW_LOG_WARNING << "memory budget reached: job " << d.job->job << "'s timeline not "
                       << (timeline.empty() ? "started" : "sampled") << " (" << growth
                       << " bytes more; --max-memory-mib)"
                       << (suppressed > 0 ? absl::StrCat(", ", suppressed, " more not logged")
                                          : std::string());
      }
      continue;
    }
    room -= std::max<int64_t>(0, growth);
    timeline.Add(d.sample, t->second.report.first_step(), t->second.report.start_unix_nanos());
  }
}

void ReportStore::Forget(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  if (running_.erase(std::string(job)) > 0) running_to_delete_.insert(std::string(job));
}

void ReportStore::KeepFinished(v1::JobReport report) {
  const std::string job = report.job();
  finished_timeline_bytes_[job] = TimelineBytes(report);
  finished_[job] = std::move(report);
  to_delete_.erase(job);
  to_write_.insert(job);
  while (static_cast<int>(finished_.size()) > std::max(1, options_.max_reports)) {
    auto oldest =
        std::min_element(finished_.begin(), finished_.end(), [](const auto& a, const auto& b) {
          return a.second.end_unix_nanos() < b.second.end_unix_nanos();
        });
    SW_LOG_INFO << "dropping the report of job " << oldest->first << ": more than "
                << options_.max_reports << " reports";
    DropFinished(std::string(oldest->first));
  }
}

void ReportStore::DropFinished(const std::string& job) {
  finished_.erase(job);
  finished_timeline_bytes_.erase(job);
  to_write_.erase(job);
  to_delete_.insert(job);
}

void ReportStore::Prune(int64_t now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> gone;
  for (const auto& [job, t] : running_) {
    if (t.recovered && now - t.recovered_at > options_.recovered_expire_nanos) gone.push_back(job);
  }
  for (const std::string& job : gone) {
    SW_LOG_INFO << "job " << job << " has not reported since the collector restarted: its report "
                << "is finished as expired";
    auto it = running_.find(job);
    EndTimeline(&it->second, it->second.report.updated_unix_nanos());
    v1::JobReport report = std::move(it->second.report);
    running_.erase(it);
    report.set_state("finished");
    report.set_end_reason("expired");
    report.set_end_unix_nanos(now);
    report.set_updated_unix_nanos(now);
    running_to_delete_.insert(job);
    KeepFinished(std::move(report));
  }
  std::vector<std::string> old;
  for (const auto& [job, report] : finished_) {
    if (report.end_unix_nanos() < now - options_.retention_nanos) old.push_back(job);
  }
  for (const std::string& job : old) DropFinished(job);
}

int ReportStore::unsaved_count() const {
  absl::MutexLock lock(&mu_);
  return options_.dir.empty() ? 0 : static_cast<int>(to_write_.size() + in_flight_.size());
}

int64_t ReportStore::unsaved_bytes() const {
  absl::MutexLock lock(&mu_);
  if (options_.dir.empty()) return 0;
  // Bounded by max_reports; computed when asked, so that it is never stale.
  int64_t bytes = 0;
  for (const auto* set : {&to_write_, &in_flight_}) {
    for (const std::string& job : *set) {
      if (auto it = finished_.find(job); it != finished_.end()) {
        bytes += static_cast<int64_t>(it->second.ByteSizeLong());
      }
    }
  }
  return bytes;
}

int64_t ReportStore::timeline_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const auto& [job, t] : running_) bytes += t.timeline.bytes();
  // An unsaved report's timeline is part of unsaved_bytes() already.
  for (const auto& [job, b] : finished_timeline_bytes_) {
    if (!Unsaved(job)) bytes += b;
  }
  return bytes;
}

uint64_t ReportStore::save_errors() const {
  absl::MutexLock lock(&mu_);
  return save_errors_;
}

bool ReportStore::Unsaved(const std::string& job) const {
  return !options_.dir.empty() && (to_write_.contains(job) || in_flight_.contains(job));
}

absl::StatusOr<v1::JobReport> ReportStore::Get(absl::string_view job) const {
  absl::MutexLock lock(&mu_);
  if (auto it = running_.find(job); it != running_.end()) return WithTimeline(it->second);
  if (auto it = finished_.find(job); it != finished_.end()) {
    v1::JobReport r = it->second;
    r.set_unsaved(Unsaved(r.job()));
    return r;
  }
  return absl::NotFoundError(absl::StrCat("no report of a job named \"", job, "\""));
}

std::vector<v1::JobReport> ReportStore::List() const {
  std::vector<v1::JobReport> out;
  absl::MutexLock lock(&mu_);
  out.reserve(running_.size() + finished_.size());
  auto add = [this, &out](const v1::JobReport& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Field by field: copying the whole report would copy every finding only to drop it.
    v1::JobReport& s = out.emplace_back();
    s.set_job(r.job());
    s.set_state(r.state());
    s.set_end_reason(r.end_reason());
    s.set_world_size(r.world_size());
    s.set_first_step(r.first_step());
    s.set_last_step(r.last_step());
    s.set_start_unix_nanos(r.start_unix_nanos());
    s.set_end_unix_nanos(r.end_unix_nanos());
    s.set_updated_unix_nanos(r.updated_unix_nanos());
    s.set_step_seconds(r.step_seconds());
    if (r.has_efficiency_ratio()) s.set_efficiency_ratio(r.efficiency_ratio());
    *s.mutable_time_ratio() = r.time_ratio();
    *s.mutable_whatif_speedup_ratio() = r.whatif_speedup_ratio();
    if (r.has_scaling_efficiency_ratio()) {
      s.set_scaling_efficiency_ratio(r.scaling_efficiency_ratio());
    }
    s.set_finding_count(r.finding_count());
    s.set_findings_dropped(r.findings_dropped());
    *s.mutable_section_names() = r.section_names();
    s.set_sections_folded(r.sections_folded());
    s.set_unsaved(r.state() == "finished" && Unsaved(r.job()));
    *s.mutable_gaps() = r.gaps();
  };
  for (const auto& [job, t] : running_) add(t.report);
  for (const auto& [job, r] : finished_) add(r);
  std::sort(out.begin(), out.end(), [](const v1::JobReport& a, const v1::JobReport& b) {
    if (a.updated_unix_nanos() != b.updated_unix_nanos()) {
      return a.updated_unix_nanos() > b.updated_unix_nanos();
    }
    return a.job() < b.job();
  });
  return out;
}

}  // namespace stepwatch::collector
