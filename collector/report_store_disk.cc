// The disk side of job reports: the file of each job (a name safe for any job), loading the
// finished and running reports at start (a running one continues with the stretch the collector
// missed marked as a gap), and Flush, which writes the finished reports not saved yet and the
// running ones that changed, deletes the files of dropped ones, and backs off after a failure.
// Files are turned into JSON and written outside the store's lock, so that disk latency never
// holds up ingest; flush_mu_ keeps one Flush at a time so that a file's write and deletion keep
// their order.
#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "collector/job_timeline.h"
#include "collector/report_store.h"
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

}  // namespace

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

// One Flush's files: the reports to write (copied under the lock, turned into JSON outside it: a
// large job's timeline takes long) and the files to delete, and how each went.
struct ReportStore::FlushWork {
  struct Write {
    std::string job;
    std::string path;
    v1::JobReport report;
    bool running = false;
    int64_t updated = 0;
    bool ok = false;
  };
  std::vector<Write> writes;
  std::vector<std::pair<std::string, bool>> deletes;  // job, running
  std::vector<std::pair<std::string, bool>> failed_deletes;
  int failures = 0;
  absl::Status first_error;

  void Failed(absl::Status st) {
    ++failures;
    if (first_error.ok()) first_error = std::move(st);
  }
};

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
  FlushWork work;
  {
    absl::MutexLock lock(&mu_);
    TakeFlushWork(now, force, &work);
  }
  WriteReports(&work);
  DeleteFiles(&work);
  int written = 0;
  int unsaved = 0;
  {
    absl::MutexLock lock(&mu_);
    SettleFlush(now, work, &written, &unsaved);
  }
  NoteFlushOutcome(now, force, work, written, unsaved);
  return work.failures;
}

void ReportStore::TakeFlushWork(int64_t now, bool force, FlushWork* work) {
  for (const std::string& job : to_write_) {
    work->writes.push_back({job, PathOf(job), finished_.at(job)});
    in_flight_.insert(job);
  }
  to_write_.clear();
  if (force || options_.running_save_interval_nanos > 0) TakeRunningWrites(now, force, work);
  for (const std::string& job : to_delete_) work->deletes.emplace_back(job, false);
  for (const std::string& job : running_to_delete_) {
    if (!running_.contains(job)) work->deletes.emplace_back(job, true);
  }
  to_delete_.clear();
  running_to_delete_.clear();
}

void ReportStore::TakeRunningWrites(int64_t now, bool force, FlushWork* work) {
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
    work->writes.push_back({job, RunningPathOf(job), std::move(report), true, updated});
  }
}

void ReportStore::WriteReports(FlushWork* work) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  for (FlushWork::Write& w : work->writes) {
    std::string json;
    const auto converted = google::protobuf::util::MessageToJsonString(w.report, &json, print);
    w.report.Clear();
    absl::Status st =
        converted.ok()
            ? WriteFileAtomically(w.path, json)
            : absl::InternalError(absl::StrCat("cannot write the report of ", w.job,
                                               " as JSON: ", std::string(converted.message())));
    w.ok = st.ok();
    if (!w.ok) work->Failed(std::move(st));
  }
}

void ReportStore::DeleteFiles(FlushWork* work) const {
  for (const auto& [job, running] : work->deletes) {
    std::error_code ec;
    const std::string path = running ? RunningPathOf(job) : PathOf(job);
    std::filesystem::remove(path, ec);
    if (ec) {
      work->failed_deletes.emplace_back(job, running);
      work->Failed(
          absl::UnavailableError(absl::StrCat("cannot delete ", path, ": ", ec.message())));
    }
  }
}

void ReportStore::SettleFlush(int64_t now, const FlushWork& work, int* written, int* unsaved) {
  for (const FlushWork::Write& w : work.writes) {
    if (w.ok) ++*written;
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
  for (const auto& [job, running] : work.failed_deletes) {
    if (running && !running_.contains(job)) running_to_delete_.insert(job);
    if (!running && !finished_.contains(job)) to_delete_.insert(job);
  }
  save_errors_ += work.failures;
  *unsaved = static_cast<int>(to_write_.size());
}

void ReportStore::NoteFlushOutcome(int64_t now, bool force, const FlushWork& work, int written,
                                   int unsaved) {
  // Logged once per change: when writes start failing, and when they succeed again.
  if (work.failures > 0) {
    if (!failing_) {
      failing_ = true;
      failing_since_ = now;
      backoff_ = std::max<int64_t>(options_.retry_initial_nanos, 1'000'000);
      SW_LOG_WARNING << "cannot save job reports under --state-dir: " << work.first_error << "; "
                     << unsaved << " finished reports kept in memory, marked unsaved, and "
                     << "written when the disk takes them (retried after "
                     << backoff_ / 1'000'000'000.0 << " s, backing off to "
                     << options_.retry_max_nanos / 1'000'000'000.0 << " s)";
    } else {
      backoff_ = std::min(backoff_ * 2, std::max(options_.retry_max_nanos, backoff_));
    }
    retry_at_ = now + backoff_;
  } else if (failing_ && !work.writes.empty()) {
    failing_ = false;
    SW_LOG_INFO << "job reports saved again under --state-dir: " << written << " written"
                << (force ? ""
                          : absl::StrCat(" after ", (now - failing_since_) / 1'000'000'000.0,
                                         " s of failures"));
  }
}
}  // namespace stepwatch::collector
