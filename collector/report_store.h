// Job reports: each job's whole life (every finding it ever had, its last known efficiency,
// breakdown and what-ifs, steps and times), kept after the job ends so that it can be asked about
// afterwards (stepwatchctl report, a Slurm epilog). Finished reports are written to a directory,
// one file per job, and loaded again at start; they are bounded in age and number. Running jobs'
// reports are written too (DIR/running, every running_save_interval and at shutdown), so that a
// restarted collector continues them, with the stretch it missed recorded as a gap.
//
// A report that cannot be written (a full or failing disk) stays in memory, marked unsaved, and
// is retried with a backoff; the failures are counted and logged once per change (failing, saved
// again).
//
// Each running job's report also records the job over time (JobReport.timeline, see
// collector/job_timeline.h), sampled from the published state once per tick; a finished report
// keeps it, and running reports carry it across a restart.
//
// Thread-safe. The collector feeds it under its own lock (Observe, Finish); file writes happen
// later, in Flush, so that disk latency never holds up ingest; timeline samples are taken outside
// that lock (SampleTimelines).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "analysis/engine.h"
#include "collector/job_timeline.h"
#include "collector/pod_index.h"
#include "collector/published_state.h"
#include "common/log.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

struct ReportStoreOptions {
  // Directory of the finished reports; empty keeps them in memory only.
  std::string dir;
  // Finished reports older than this (by end time) are dropped.
  int64_t retention_nanos = 604'800'000'000'000;
  // Most finished reports kept; the oldest are dropped first.
  int max_reports = 1000;
  // Most findings kept per report; beyond it the oldest cleared ones are dropped (and counted).
  int max_findings_per_report = 1000;
  // A running report that changed is written at most this often (0: only at shutdown), and at
  // most max_running_writes_per_flush of them per Flush (each is a file write and an fsync; those
  // saved longest ago first), so that many jobs cannot hold up the collector's tick.
  int64_t running_save_interval_nanos = 10'000'000'000;
  int max_running_writes_per_flush = 16;
  // After a failed write, writes wait this long, doubling up to retry_max_nanos.
  int64_t retry_initial_nanos = 1'000'000'000;
  int64_t retry_max_nanos = 30'000'000'000;
  // A running report loaded at start whose job reports nothing for this long is finished as
  // "expired" (the collector's --expire).
  int64_t recovered_expire_nanos = 300'000'000'000;
  // Each running job's timeline: its bounds and first sample interval.
  JobTimelineOptions timeline;
};

// What the collector knows of a job besides the engine's snapshot.
struct JobSpan {
  int64_t first_step = -1;
  int64_t start_unix_nanos = 0;
};

class ReportStore {
 public:
  explicit ReportStore(ReportStoreOptions options);
  // Writes what is still pending.
  ~ReportStore();
  ReportStore(const ReportStore&) = delete;
  ReportStore& operator=(const ReportStore&) = delete;

  // Creates the directory and loads its reports. A file that cannot be read or parsed is logged
  // and skipped; an error only when the directory itself is unusable. No-op without a directory.
  absl::Status Load(int64_t now_unix_nanos);

  // A running job's latest snapshot and its active findings (those of other jobs are ignored):
  // new findings open entries, findings gone since the previous call are closed at the job's
  // last step. `attribute` (when set) gives each finding's Kubernetes pod.
  void Observe(const analysis::JobSnapshot& job, const std::vector<analysis::Finding>& active,
               const JobSpan& span, int64_t now_unix_nanos,
               const FindingAttribution& attribute = nullptr);
  // The job ended (`reason`: "exited" or "expired"): its findings as last seen are recorded and
  // closed at its last step, and the report is kept (and queued for writing).
  void Finish(const analysis::JobSnapshot& job, const std::vector<analysis::Finding>& active,
              const JobSpan& span, absl::string_view reason, int64_t now_unix_nanos,
              const FindingAttribution& attribute = nullptr);
  // The job moved to other collectors: its running report is dropped, not kept (they hold the
  // job's whole life; this collector saw a part of it).
  void Forget(absl::string_view job);
  // Drops finished reports past the retention, and finishes ("expired") the running reports
  // loaded at start whose job did not report again within recovered_expire_nanos.
  void Prune(int64_t now_unix_nanos);

  // Writes the finished reports not saved yet, the running reports that changed (at most every
  // running_save_interval), and deletes the files of dropped ones; returns how many writes or
  // deletions failed. After a failure, nothing is tried before the backoff has passed.
  int Flush(int64_t now_unix_nanos);
  // Writes everything now, running reports included, whatever the backoff (at shutdown).
  int Flush();

  // Samples the timeline of every running job of `view` that is due (its last step advanced and
  // its sample interval passed) from the view's rank rows and nodes. Called once per tick outside
  // the collector's ingest mutex, with a view whose rank rows that tick rebuilt; the pass over
  // each job's ranks runs outside this store's lock too. A sample whose new rows and nodes would
  // take more than `room_bytes` (what the memory budget has left) is not taken (logged at a
  // bounded rate): a new job has no timeline until there is room for it.
  void SampleTimelines(const PublishedState& view, int64_t now_unix_nanos,
                       int64_t room_bytes = std::numeric_limits<int64_t>::max());

  // Finished reports not yet written, and their bytes (charged against the memory budget).
  int unsaved_count() const;
  int64_t unsaved_bytes() const;
  // Memory the timelines hold: the running jobs' and those of finished reports not counted by
  // unsaved_bytes() (charged against the memory budget too).
  int64_t timeline_bytes() const;
  // Writes and deletions that failed, in all.
  uint64_t save_errors() const;

  // The job's report, running or finished (running first); NotFound otherwise.
  absl::StatusOr<v1::JobReport> Get(absl::string_view job) const;
  // Every report, newest (last updated) first, without findings (finding_count says how many).
  std::vector<v1::JobReport> List() const;

  // The file name of a job's report: safe for any job name (no '/', no leading dot, at most 200
  // bytes), distinct for distinct names.
  static std::string FileName(absl::string_view job);

 private:
  // (kind, rank, node, gpu, stage): what makes two findings the same.
  // (kind, rank, node, gpu, stage, device).
  using FindingKey = std::tuple<std::string, int, std::string, int, int, std::string>;
  struct Tracked {
    v1::JobReport report;
    // Active findings -> their position in report.findings.
    absl::flat_hash_map<FindingKey, int> active;
    // Loaded from DIR/running at start, and not seen since (its last gap is open).
    bool recovered = false;
    int64_t recovered_at = 0;
    // report.updated_unix_nanos when it was last written (0: never), and when that was.
    int64_t saved_updated = 0;
    int64_t saved_at = 0;
    // The job over time; copied into report.timeline when it is read, saved or finished.
    JobTimeline timeline;
  };

  void Update(Tracked* t, const analysis::JobSnapshot& job,
              const std::vector<analysis::Finding>& active, const JobSpan& span, int64_t now,
              const FindingAttribution& attribute) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends a finding entry, dropping the oldest cleared one when full; false when full of
  // active findings (the new one is dropped and counted).
  bool Append(Tracked* t, const v1::Finding& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseAll(Tracked* t, int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KeepFinished(v1::JobReport report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running report as read or saved: with its timeline.
  v1::JobReport WithTimeline(const Tracked& t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a running job's timeline into its report (the job ended): its last column extends to
  // the report's last step, last seen at `last_seen`.
  void EndTimeline(Tracked* t, int64_t last_seen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropFinished(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PathOf(absl::string_view job) const;
  std::string RunningPathOf(absl::string_view job) const;
  // Loads DIR/running (under Load).
  void LoadRunning(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int FlushAt(int64_t now, bool force) ABSL_LOCKS_EXCLUDED(mu_);
  // The steps of FlushAt (collector/report_store_disk.cc): what to write and delete, taken under
  // the lock; the writes and deletions, outside it; their outcome, recorded under it again; and
  // the backoff and the log lines of a change (failing, saved again).
  struct FlushWork;
  void TakeFlushWork(int64_t now, bool force, FlushWork* work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeRunningWrites(int64_t now, bool force, FlushWork* work)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void WriteReports(FlushWork* work);
  void DeleteFiles(FlushWork* work) const;
  void SettleFlush(int64_t now, const FlushWork& work, int* written, int* unsaved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteFlushOutcome(int64_t now, bool force, const FlushWork& work, int written, int unsaved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_);
  // Memory a report's timeline holds (reflection: measured once per finished report).
  static int64_t TimelineBytes(const v1::JobReport& r);
  bool Unsaved(const std::string& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReportStoreOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Tracked> running_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, v1::JobReport> finished_ ABSL_GUARDED_BY(mu_);
  // Memory each finished report's timeline holds (measured once, when it is kept).
  absl::flat_hash_map<std::string, int64_t> finished_timeline_bytes_ ABSL_GUARDED_BY(mu_);
  // Jobs whose finished report must be written (or is being written), and files to delete.
  absl::flat_hash_set<std::string> to_write_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> in_flight_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> to_delete_ ABSL_GUARDED_BY(mu_);
  // Running reports' files to delete (the job finished or moved away).
  absl::flat_hash_set<std::string> running_to_delete_ ABSL_GUARDED_BY(mu_);
  uint64_t save_errors_ ABSL_GUARDED_BY(mu_) = 0;
  LogRateLimiter timeline_log_limiter_{3, std::chrono::minutes(1)};
  // One Flush at a time, so that a write and a deletion of one file keep their order.
  absl::Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Whether the last attempt failed, since when, and when to try again.
  bool failing_ ABSL_GUARDED_BY(flush_mu_) = false;
  int64_t failing_since_ ABSL_GUARDED_BY(flush_mu_) = 0;
  int64_t retry_at_ ABSL_GUARDED_BY(flush_mu_) = 0;
  int64_t backoff_ ABSL_GUARDED_BY(flush_mu_) = 0;
};

}  // namespace stepwatch::collector
