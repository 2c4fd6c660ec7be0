#include "collector/report_store.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "collector/convert.h"
#include "common/file.h"
#include "common/log.h"
#include "google/protobuf/util/json_util.h"

namespace stepwatch::collector {
namespace {

constexpr absl::string_view kSuffix = ".json";
// Room for the suffix and the atomic write's ".tmp.PID" within a 255-byte file name.
constexpr size_t kMaxStemBytes = 200;
constexpr size_t kMaxFileBytes = 64 << 20;
// Running reports live in DIR/running, apart from the finished ones.
constexpr absl::string_view kRunningDir = "running";
constexpr int kMaxGaps = 64;

uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

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

// Memory a report's timeline holds (reflection: measured once per finished report).
int64_t TimelineBytes(const v1::JobReport& r) {
  return r.has_timeline() ? static_cast<int64_t>(r.timeline().SpaceUsedLong()) : 0;
}

}  // namespace

ReportStore::ReportStore(ReportStoreOptions options) : options_(std::move(options)) {}

ReportStore::~ReportStore() { Flush(); }

std::string ReportStore::FileName(absl::string_view job) {
  // Letters, digits, '-' and '_' stay; every other byte becomes %XX, so no name holds '/' or
  // starts with a dot, and distinct names stay distinct.
  std::string stem;
  stem.reserve(job.size());
  for (unsigned char c : job) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_') {
      stem += static_cast<char>(c);
    } else {
      absl::StrAppendFormat(&stem, "%%%02X", c);
    }
  }
  if (stem.empty()) stem = "%";
  if (stem.size() > kMaxStemBytes) {
    // '~' never appears in an encoded name: a shortened name cannot equal a full one.
    stem = absl::StrFormat("%s~%016x", stem.substr(0, kMaxStemBytes - 17), Fnv1a64(job));
  }
  return absl::StrCat(stem, kSuffix);
}

std::string ReportStore::PathOf(absl::string_view job) const {
  return absl::StrCat(options_.dir, "/", FileName(job));
}

std::string ReportStore::RunningPathOf(absl::string_view job) const {
  return absl::StrCat(options_.dir, "/", kRunningDir, "/", FileName(job));
}

namespace {

// The reports in `dir` (files named after their job), each parsed; unreadable ones are logged
// and skipped.
std::vector<v1::JobReport> ReadReports(const std::string& dir, std::error_code* ec) {
  std::vector<v1::JobReport> out;
  std::filesystem::directory_iterator it(dir, *ec);
  if (*ec) return out;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = true;
  for (; it != std::filesystem::directory_iterator(); it.increment(*ec)) {
    const std::filesystem::path& path = it->path();
    const std::string name = path.filename().string();
    std::error_code type_ec;
    if (!absl::EndsWith(name, kSuffix) || !it->is_regular_file(type_ec)) continue;
    absl::StatusOr<std::string> data = ReadFile(path.string(), kMaxFileBytes);
    if (!data.ok()) {
      SW_LOG_WARNING << "skipping report " << path.string() << ": " << data.status();
      continue;
    }
    v1::JobReport report;
    auto parsed = google::protobuf::util::JsonStringToMessage(*data, &report, parse);
    if (!parsed.ok() || report.job().empty() || ReportStore::FileName(report.job()) != name) {
      SW_LOG_WARNING << "skipping report " << path.string() << ": "
                     << (parsed.ok() ? "not the report of a job of that name"
                                     : std::string(parsed.message()));
      continue;
    }
    report.set_unsaved(false);
    out.push_back(std::move(report));
  }
  return out;
}

}  // namespace

absl::Status ReportStore::Load(int64_t now) {
  if (options_.dir.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("cannot create ", options_.dir, ": ", ec.message()));
  if (std::filesystem::directory_iterator probe(options_.dir, ec); ec) {
    return absl::UnavailableError(absl::StrCat("cannot list ", options_.dir, ": ", ec.message()));
  }
  std::vector<v1::JobReport> reports = ReadReports(options_.dir, &ec);
  if (ec) SW_LOG_WARNING << "listing " << options_.dir << " stopped early: " << ec.message();
  int loaded = 0;
  absl::MutexLock lock(&mu_);
  for (v1::JobReport& report : reports) {
    report.set_state("finished");
    if (report.end_unix_nanos() < now - options_.retention_nanos) {
      to_delete_.insert(report.job());
      continue;
    }
    const std::string job = report.job();
    finished_timeline_bytes_[job] = TimelineBytes(report);
    finished_[job] = std::move(report);
    ++loaded;
  }
  // Bound the number too (a smaller --max-reports than before).
  while (static_cast<int>(finished_.size()) > options_.max_reports) {
    auto oldest =
        std::min_element(finished_.begin(), finished_.end(), [](const auto& a, const auto& b) {
          return a.second.end_unix_nanos() < b.second.end_unix_nanos();
        });
    DropFinished(std::string(oldest->first));
  }
  SW_LOG_INFO << "loaded " << loaded << " job reports from " << options_.dir;
  LoadRunning(now);
  return absl::OkStatus();
}

void ReportStore::LoadRunning(int64_t now) {
  const std::string dir = absl::StrCat(options_.dir, "/", kRunningDir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    SW_LOG_WARNING << "cannot create " << dir << ": " << ec.message()
                   << "; running jobs' reports will not survive a restart";
    return;
  }
  std::vector<v1::JobReport> reports = ReadReports(dir, &ec);
  if (ec) SW_LOG_WARNING << "listing " << dir << " stopped early: " << ec.message();
  int recovered = 0;
  for (v1::JobReport& report : reports) {
    const std::string job = report.job();
    // Finished since (its finished report was written, the running one not yet deleted).
    if (auto f = finished_.find(job);
        f != finished_.end() && f->second.end_unix_nanos() >= report.updated_unix_nanos()) {
      running_to_delete_.insert(job);
      continue;
    }
    Tracked t;
    t.recovered = true;
    t.recovered_at = now;
    t.saved_updated = report.updated_unix_nanos();
    report.set_state("running");
    // What was active when it was saved is known to have lasted until then, no further: a
    // finding still there is found again as a new entry.
    for (v1::Finding& f : *report.mutable_findings()) {
      if (f.until_step() >= 0) continue;
      f.set_until_step(report.last_step());
      f.set_until_unix_nanos(report.updated_unix_nanos());
    }
    // The oldest gaps go first: room for this one.
    if (report.gaps_size() >= kMaxGaps) {
      report.mutable_gaps()->DeleteSubrange(0, report.gaps_size() - kMaxGaps + 1);
    }
    v1::ReportGap* gap = report.add_gaps();
    gap->set_after_step(report.last_step());
    gap->set_before_step(-1);
    gap->set_from_unix_nanos(report.updated_unix_nanos());
    gap->set_cause("collector_restart");
    // The timeline goes on from its last column (the steps of the gap fall in the next one).
    t.timeline = JobTimeline::FromProto(report.timeline(), options_.timeline);
    report.clear_timeline();
    t.report = std::move(report);
    running_[job] = std::move(t);
    ++recovered;
  }
  if (recovered > 0) {
    SW_LOG_INFO << "continuing the reports of " << recovered << " running jobs from " << dir
                << " (what they did while the collector was down is marked as a gap)";
  }
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

void ReportStore::SampleTimelines(const PublishedView& view, int64_t now, int64_t room) {
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

int ReportStore::Flush(int64_t now) { return FlushAt(now, /*force=*/false); }

int ReportStore::Flush() { return FlushAt(0, /*force=*/true); }

int ReportStore::FlushAt(int64_t now, bool force) {
  absl::MutexLock flush_lock(&flush_mu_);
  if (options_.dir.empty()) {
    absl::MutexLock lock(&mu_);
    to_write_.clear();
    to_delete_.clear();
    running_to_delete_.clear();
    return 0;
  }
  if (!force && failing_ && now < retry_at_) return 0;
  const bool save_running = force || options_.running_save_interval_nanos > 0;
  struct Write {
    std::string job;
    std::string path;
    // Copied under the lock, turned into JSON outside it (a large job's timeline takes long).
    v1::JobReport report;
    bool running = false;
    int64_t updated = 0;
    bool ok = false;
  };
  std::vector<Write> writes;
  std::vector<std::pair<std::string, bool>> deletes;  // job, running
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& job : to_write_) {
      writes.push_back({job, PathOf(job), finished_.at(job)});
      in_flight_.insert(job);
    }
    to_write_.clear();
    if (save_running) {
      // Changed and due, those saved longest ago first.
      std::vector<std::pair<int64_t, const std::string*>> due;
      for (const auto& [job, t] : running_) {
        if (t.report.updated_unix_nanos() == t.saved_updated) continue;
        if (!force && t.saved_at > 0 && now - t.saved_at < options_.running_save_interval_nanos) {
          continue;
        }
        due.emplace_back(t.saved_at, &job);
      }
      const size_t cap =
          force ? due.size()
                : std::min(due.size(),
                           static_cast<size_t>(std::max(1, options_.max_running_writes_per_flush)));
      std::partial_sort(due.begin(), due.begin() + cap, due.end());
      for (size_t i = 0; i < cap; ++i) {
        const std::string& job = *due[i].second;
        v1::JobReport report = WithTimeline(running_.at(job));
        const int64_t updated = report.updated_unix_nanos();
        writes.push_back({job, RunningPathOf(job), std::move(report), true, updated});
      }
    }
    for (const std::string& job : to_delete_) deletes.emplace_back(job, false);
    for (const std::string& job : running_to_delete_) {
      if (!running_.contains(job)) deletes.emplace_back(job, true);
    }
    to_delete_.clear();
    running_to_delete_.clear();
  }
  int failures = 0;
  absl::Status first_error;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  for (Write& w : writes) {
    std::string json;
    const auto converted = google::protobuf::util::MessageToJsonString(w.report, &json, print);
    w.report.Clear();
    absl::Status st =
        converted.ok()
            ? WriteFileAtomically(w.path, json)
            : absl::InternalError(absl::StrCat("cannot write the report of ", w.job,
                                               " as JSON: ", std::string(converted.message())));
    w.ok = st.ok();
    if (!w.ok) {
      ++failures;
      if (first_error.ok()) first_error = st;
    }
  }
  std::vector<std::pair<std::string, bool>> failed_deletes;
  for (const auto& [job, running] : deletes) {
    std::error_code ec;
    const std::string path = running ? RunningPathOf(job) : PathOf(job);
    std::filesystem::remove(path, ec);
    if (ec) {
      ++failures;
      failed_deletes.emplace_back(job, running);
      if (first_error.ok()) {
        first_error =
            absl::UnavailableError(absl::StrCat("cannot delete ", path, ": ", ec.message()));
      }
    }
  }
  int unsaved = 0;
  int written = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const Write& w : writes) {
      if (w.ok) ++written;
      if (w.running) {
        if (auto it = running_.find(w.job); w.ok && it != running_.end()) {
          it->second.saved_updated = w.updated;
          it->second.saved_at = now;
        }
        continue;
      }
      in_flight_.erase(w.job);
      // Kept in memory and written again later; unless dropped meanwhile (--max-reports).
      if (!w.ok && finished_.contains(w.job)) to_write_.insert(w.job);
    }
    for (const auto& [job, running] : failed_deletes) {
      if (running && !running_.contains(job)) running_to_delete_.insert(job);
      if (!running && !finished_.contains(job)) to_delete_.insert(job);
    }
    save_errors_ += failures;
    unsaved = static_cast<int>(to_write_.size());
  }
  // Logged once per change: when writes start failing, and when they succeed again.
  if (failures > 0) {
    if (!failing_) {
      failing_ = true;
      failing_since_ = now;
      backoff_ = std::max<int64_t>(options_.retry_initial_nanos, 1'000'000);
      SW_LOG_WARNING << "cannot save job reports under --state-dir: " << first_error << "; "
                     << unsaved << " finished reports kept in memory, marked unsaved, and "
                     << "written when the disk takes them (retried after "
                     << backoff_ / 1'000'000'000.0 << " s, backing off to "
                     << options_.retry_max_nanos / 1'000'000'000.0 << " s)";
    } else {
      backoff_ = std::min(backoff_ * 2, std::max(options_.retry_max_nanos, backoff_));
    }
    retry_at_ = now + backoff_;
  } else if (failing_ && !writes.empty()) {
    failing_ = false;
    SW_LOG_INFO << "job reports saved again under --state-dir: " << written << " written"
                << (force ? ""
                          : absl::StrCat(" after ", (now - failing_since_) / 1'000'000'000.0,
                                         " s of failures"));
  }
  return failures;
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
