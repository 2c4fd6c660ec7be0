// Job reports: each job's whole life (every finding it ever had, its last known efficiency,
// breakdown and what-ifs, steps and times), kept after the job ends so that it can be asked about
// afterwards (stepwatchctl report, a Slurm epilog). Finished reports are written to a directory,
// one file per job, and loaded again at start; they are bounded in age and number.
//
// Thread-safe. The collector feeds it under its own lock (Observe, Finish); file writes happen
// later, in Flush, so that disk latency never holds up ingest.
#pragma once

#include <cstdint>
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
  // last step.
  void Observe(const analysis::JobSnapshot& job, const std::vector<analysis::Finding>& active,
               const JobSpan& span, int64_t now_unix_nanos);
  // The job ended (`reason`: "exited" or "expired"): its findings as last seen are recorded and
  // closed at its last step, and the report is kept (and queued for writing).
  void Finish(const analysis::JobSnapshot& job, const std::vector<analysis::Finding>& active,
              const JobSpan& span, absl::string_view reason, int64_t now_unix_nanos);
  // The job moved to other collectors: its running report is dropped, not kept (they hold the
  // job's whole life; this collector saw a part of it).
  void Forget(absl::string_view job);
  // Drops finished reports past the retention.
  void Prune(int64_t now_unix_nanos);

  // Writes the finished reports queued since the last call and deletes the files of dropped ones;
  // returns how many writes or deletions failed (each is logged).
  int Flush();

  // The job's report, running or finished (running first); NotFound otherwise.
  absl::StatusOr<v1::JobReport> Get(absl::string_view job) const;
  // Every report, newest (last updated) first, without findings (finding_count says how many).
  std::vector<v1::JobReport> List() const;

  // The file name of a job's report: safe for any job name (no '/', no leading dot, at most 200
  // bytes), distinct for distinct names.
  static std::string FileName(absl::string_view job);

 private:
  // (kind, rank, node, gpu, stage): what makes two findings the same.
  using FindingKey = std::tuple<std::string, int, std::string, int, int>;
  struct Tracked {
    v1::JobReport report;
    // Active findings -> their position in report.findings.
    absl::flat_hash_map<FindingKey, int> active;
  };

  void Update(Tracked* t, const analysis::JobSnapshot& job,
              const std::vector<analysis::Finding>& active, const JobSpan& span, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends a finding entry, dropping the oldest cleared one when full; false when full of
  // active findings (the new one is dropped and counted).
  bool Append(Tracked* t, const v1::Finding& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseAll(Tracked* t, int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KeepFinished(v1::JobReport report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropFinished(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PathOf(absl::string_view job) const;

  const ReportStoreOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Tracked> running_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, v1::JobReport> finished_ ABSL_GUARDED_BY(mu_);
  // Jobs whose finished report must be written, and files to delete.
  absl::flat_hash_set<std::string> to_write_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> to_delete_ ABSL_GUARDED_BY(mu_);
  // One Flush at a time, so that a write and a deletion of one file keep their order.
  absl::Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace stepwatch::collector
