// The collector's state: the analysis engine behind the ingest mutex, the last readings of every
// node, batch deduplication, limits, expiry and the collector's own counters. Thread-safe. Ingest
// (gRPC reactors) and the ticker take the ingest mutex; readers (/metrics scrapes, stepwatchctl
// queries) only read the immutable view that each Tick() publishes, and never wait for ingest.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/dedupe.h"
#include "collector/memory_budget.h"
#include "collector/pod_index.h"
#include "collector/published_state.h"
#include "collector/report_store.h"
#include "common/clock.h"
#include "common/log.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

struct CollectorStateOptions {
  analysis::EngineOptions engine;
  // Jobs and nodes unseen for this long are forgotten, with their series.
  int64_t expire_nanos = 300'000'000'000;
  // Sender timestamps (step receipt, GPU and host samples, rank exits) further than this from the
  // collector's clock are replaced by the collector's time and counted: one node with a wrong
  // clock, or one hostile batch, must not move the engine's notion of now for every job.
  int64_t max_clock_skew_nanos = 30'000'000'000;
  // A node is reported down (stepwatch_node_up 0) when unseen for this long.
  int64_t node_down_nanos = 15'000'000'000;
  // Limits; what would exceed one is dropped and counted in limit_hits{limit}. The limits on jobs
  // and ranks per job are the engine's (engine.max_jobs, engine.max_ranks_per_job).
  int max_nodes = 20000;
  int max_gpus_per_node = 64;
  // Jobs one node may have opened (sent the first step of) among those tracked (0: no cap), so
  // that one node inventing job ids cannot take every --max-jobs slot: its further new jobs are
  // refused and counted (limit_hits{limit="jobs_per_node"}, node_refusals{node, "jobs_per_node"})
  // while other nodes' new jobs are still admitted. A slot is given back when the job ends.
  int max_jobs_per_node = 64;
  // Memory budget in bytes for what the collector tracks (0: none). Every job, rank, node and GPU
  // is charged an accounted cost (MemoryCosts) when first admitted; what would exceed the budget
  // is refused and counted in limit_hits{limit="memory"}, while what is tracked keeps being
  // analysed. Charges are returned when jobs and nodes are forgotten.
  int64_t max_memory_bytes = 0;
  // Status() and Findings() answers (stepwatchctl status, findings) stop adding nodes or findings
  // beyond this size, under the gRPC send limit (64 MiB): 10,000 nodes of 8 GPUs take 5.6 MB, but
  // 64 GPUs per node with many processes would not fit.
  int64_t max_answer_bytes = 48 << 20;
  // Per-rank series on /metrics: every flagged rank, plus per job the top_ranks_per_job ranks
  // furthest above their peers' median busy time, at most max_rank_series ranks in all (flagged
  // ranks first); ranks left out are counted in CollectorCounters::rank_series_dropped.
  int top_ranks_per_job = 5;
  int max_rank_series = 2000;
  DeduperOptions dedupe;
  // Job reports (kept after jobs end); its dir is loaded at construction.
  ReportStoreOptions reports;
};

class CollectorState {
 public:
  CollectorState(CollectorStateOptions options, const Clock* clock);
  CollectorState(const CollectorState&) = delete;
  CollectorState& operator=(const CollectorState&) = delete;

  // Applies one batch (unless it is a duplicate) and returns the acknowledgement to send. Its
  // steps go to the engine first, then its samples, then its rank exits: a job whose reporting
  // ranks have all exited has finished and is forgotten at once (logged once).
  // InvalidArgument when the batch lacks agent_id, boot_id or seq. Returns once the batch's
  // journal record (with a journal) is synced.
  absl::StatusOr<v1::IngestAck> Apply(const v1::ReportBatch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Apply without waiting for the journal: the acknowledgement may be sent only once `durable`
  // resolves (Wait or Then, outside any lock; then CountJournalSyncError with its status).
  absl::StatusOr<v1::IngestAck> Apply(const v1::ReportBatch& batch, BatchDeduper::Sync* durable)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts and logs (at powers of two) a batch whose journal record could not be synced; nothing
  // for OK. Its acknowledgement still goes out (deduplication goes on in memory), unless the sync
  // was Cancelled (the journal closed first).
  void CountJournalSyncError(const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs the engine's time-driven parts, expires jobs and nodes unseen for `expire`, and publishes
  // the view that Snapshot(), Status(), Findings() and Explain() answer from until the next Tick.
  void Tick();

  void AgentConnected() { agents_connected_.fetch_add(1); }
  void AgentDisconnected() { agents_connected_.fetch_sub(1); }
  void CountIngestError();
  // A batch refused before it was applied (see CollectorCounters::malformed); also an ingest
  // error. `field` is set for reason "bad_field".
  void CountMalformed(const char* reason, const FieldProblem* field = nullptr);
  // A call or batch refused by authentication or identity checks, by reason.
  void CountRefused(const char* reason);
  void CountStateSaveError();

  // Readers of the published state: they never take the ingest mutex.
  v1::StatusResponse Status() const;
  // Empty `job`: every job's findings (idle GPUs included).
  v1::FindingsResponse Findings(absl::string_view job) const;
  // NotFound for an unknown job.
  absl::StatusOr<v1::ExplainResponse> Explain(absl::string_view job) const;
  // A copy of the published state with the live counters; under NodeScope::kInvolved its nodes are
  // only those involved in findings or quiet (the work follows them, not the fleet).
  StateSnapshot Snapshot(NodeScope scope = NodeScope::kAll) const;
  // The view published by the last Tick() (an empty one before the first); never null.
  std::shared_ptr<const PublishedState> Published() const;

  // Runs `fn` while holding the ingest mutex, as a long Apply would (for tests: readers must not
  // wait for it).
  void RunWithIngestLockHeldForTest(const std::function<void()>& fn) ABSL_LOCKS_EXCLUDED(mu_);

  std::string SerializeScalingHistory() const;
  absl::Status LoadScalingHistory(absl::string_view data);

  // Reports of running and finished jobs (updated at every Tick and when a job ends).
  const ReportStore& reports() const { return reports_; }

  // Bytes charged against max_memory_bytes now.
  int64_t MemoryAccountedBytes() const;

 private:
  // What the collector keeps of a job beside the engine's registry (which alone records which
  // jobs and ranks exist): created and erased with the engine's job.
  struct JobTrack {
    // On the collector's clock, for expiry.
    int64_t last_seen_unix_nanos = 0;
    // For the job's report: the lowest step and when the job was first seen.
    int64_t first_step = -1;
    int64_t first_seen_unix_nanos = 0;
    // Memory charged for this job: its state, rank slots (the largest world size seen) and ranks
    // (the most the engine knew at once).
    int world_size_charged = 0;
    int ranks_charged = 0;
    int64_t charged_bytes = 0;
    // What each of its ranks is charged: MemoryCosts::rank and the copies of the job's name (the
    // node index) and of the node's (the rank's record), at the opening node's name length.
    int64_t rank_bytes = 0;
    // The node whose step opened the job (counted against max_jobs_per_node); empty if unknown.
    std::string opened_by;
  };
  // What AdmitStep charged for one step, returned if the engine refuses it.
  struct Admission {
    bool admitted = false;
    bool new_job = false;
    int64_t bytes = 0;
    int ranks = 0;
    // Not admitted: the steps_rejected reason ("limit", or "foreign" for a rank or job that
    // another node holds).
    const char* rejected = "limit";
    // Admitted from another node than the rank's silent or released holder.
    bool takeover = false;
  };
  struct NodeTrack {
    NodeSnapshot view;
    absl::flat_hash_map<int, size_t> gpu_slot;  // index -> position in view.gpus
    // Charged for its strings (NodeTextBytes) beside MemoryCosts::node.
    int64_t text_bytes = 0;
  };

  // Ingest (ingest.cc): Apply's steps, in the order it takes them.
  void ApplyStep(const v1::StepEvent& event, const std::string& node, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GPU samples and the host sample of a tracked node (null: not tracked, only counted).
  void ApplyGpuSamples(const v1::ReportBatch& batch, NodeTrack* node, const std::string& node_name,
                       int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `gpu` as the last sample of its GPU; false when a limit or the budget refuses it.
  bool KeepGpuSample(const v1::GpuSample& gpu, NodeTrack* node, const std::string& node_name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyHostSample(const v1::ReportBatch& batch, NodeTrack* node, const std::string& node_name,
                       int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyRankExits(const v1::ReportBatch& batch, const std::string& node_name, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyReleasedJobs(const v1::ReportBatch& batch, const std::string& node_name, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Kubernetes attribution (rank_pods.cc): keeps the pod an admitted step names for its rank
  // (bounded, charged to the job), and what findings are labelled with.
  void KeepRankPod(const v1::StepEvent& event, const std::string& node_name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rank pods as of now, copied only when they changed since the last call.
  std::shared_ptr<const PodIndex> PublishedRankPods() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A finding's pod, from the ranks' pods and the nodes' last GPU samples.
  FindingAttribution AttributionNow() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Admission (admission.cc).
  // Not admitted (counted) when the step would exceed a limit or the memory budget, or when its
  // (job, rank) is held by another node than `node` (the one that reported it last, while it
  // keeps reporting it: it is taken over once its holder has been silent for expire_nanos or its
  // process exited), or it would rescale a job whose running ranks are all on other nodes.
  Admission AdmitStep(const v1::StepEvent& event, const std::string& node, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AdmitStep for a job the engine does not know (limits on jobs, jobs per node, the budget), and
  // for one it knows (rank binding, rescales, new ranks); the job's track, or null when refused.
  JobTrack* AdmitNewJob(const v1::StepEvent& event, const std::string& node, Admission* a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobTrack* AdmitToKnownJob(const v1::StepEvent& event, const std::string& node, int64_t now,
                            const analysis::JobHolding& held, Admission* a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a refusal that `node` caused (CollectorCounters::refused and node_refusals).
  void CountNodeRefusal(const std::string& node, const char* reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a field refused (CollectorCounters::fields_refused), logged at a bounded rate naming
  // the node and what was dropped (`what`: "batch", "node description", "GPU sample", ...).
  void CountFieldRefused(const FieldProblem& problem, absl::string_view node, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a refusal by `limit` ("jobs", "ranks_per_job", ...), logged at a bounded rate.
  void HitLimit(const char* limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeTrack* TouchNode(const v1::ReportBatch& batch, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `sender_unix_nanos` when it is set and within max_clock_skew of `now`, else `now` (counted,
  // and logged at a bounded rate naming the node).
  int64_t TrustedTime(int64_t sender_unix_nanos, int64_t now, const std::string& node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The memory budget (memory_budget.cc).
  // Charges `bytes` against the memory budget; false (counted, logged at a bounded rate) when
  // that would exceed it. `what` names the refused item in the log.
  bool Charge(int64_t bytes, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns what AdmitStep charged for a step the engine refused.
  void Refund(const std::string& job, const Admission& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the engine forgot ranks (RemoveNode): returns the charges of ranks it no longer knows.
  void RefundForgottenRanks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets a job and returns its charge.
  void EraseJob(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets a node and returns its charge (its GPUs included); the next node.
  std::map<std::string, NodeTrack>::iterator EraseNode(
      std::map<std::string, NodeTrack>::iterator node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The ticker (state.cc) and the read view (published_state.cc).
  // Tick without the reports' disk writes: advances, expires and publishes.
  void AdvanceExpireAndPublish(int64_t now) ABSL_LOCKS_EXCLUDED(mu_, tick_mu_);
  // Forgets the jobs unseen since `cutoff` (their reports end "expired"); true when any was.
  bool ExpireJobs(const std::vector<analysis::JobSnapshot>& jobs,
                  const std::vector<analysis::Finding>& findings, int64_t cutoff, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the nodes unseen since `cutoff`, and the charges of the ranks the engine forgot with
  // them; true when any was.
  bool ExpireNodes(int64_t cutoff) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills view->ranks and the per-rank series, rebuilding the rows when they are cheap or old
  // enough, else sharing the previous view's (jobs new since then always get rows).
  void PublishRankRows(PublishedState* view) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tick_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Feeds every job's snapshot and findings to the reports.
  void ObserveReports(const std::vector<analysis::JobSnapshot>& jobs,
                      const std::vector<analysis::Finding>& findings, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(std::shared_ptr<const PublishedState> view) ABSL_LOCKS_EXCLUDED(published_mu_);
  // Copies the counters and memory accounted for Snapshot(): scraped counters include every batch
  // applied so far, so that a count scraped just before the collector dies matches what it
  // acknowledged.
  void SyncCounters() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(counters_mu_);
  JobSpan SpanOf(const std::string& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the report of a job that is being removed ("exited" or "expired").
  void FinishReport(const analysis::JobSnapshot& job,
                    const std::vector<analysis::Finding>& findings, const char* reason, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CollectorStateOptions options_;
  const Clock* const clock_;
  std::atomic<int> agents_connected_{0};

  mutable absl::Mutex mu_;
  analysis::Engine engine_ ABSL_GUARDED_BY(mu_);
  BatchDeduper deduper_ ABSL_GUARDED_BY(mu_);
  uint64_t journal_sync_errors_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, JobTrack> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NodeTrack> nodes_ ABSL_GUARDED_BY(mu_);
  // The pod of each rank whose steps name one; copied into the view when it changed.
  PodIndex rank_pods_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const PodIndex> published_rank_pods_ ABSL_GUARDED_BY(mu_);
  bool rank_pods_changed_ ABSL_GUARDED_BY(mu_) = false;
  CollectorCounters counters_ ABSL_GUARDED_BY(mu_);
  LogRateLimiter skew_log_limiter_{3, std::chrono::minutes(1)};
  LogRateLimiter memory_log_limiter_{3, std::chrono::minutes(1)};
  // Steps and exits refused for ranks other nodes hold, rank takeovers, refused fields.
  LogRateLimiter foreign_log_limiter_{3, std::chrono::minutes(1)};
  LogRateLimiter takeover_log_limiter_{5, std::chrono::minutes(1)};
  LogRateLimiter field_log_limiter_{3, std::chrono::minutes(1)};
  // Jobs tracked per node that opened them (JobTrack::opened_by), for max_jobs_per_node.
  absl::flat_hash_map<std::string, int> jobs_opened_ ABSL_GUARDED_BY(mu_);
  // One per limit on counts ("jobs", "ranks_per_job", "nodes", "gpus_per_node").
  std::map<std::string, std::unique_ptr<LogRateLimiter>> limit_log_limiters_ ABSL_GUARDED_BY(mu_);
  const MemoryCosts costs_;
  int64_t accounted_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The part of accounted_bytes_ that is unsaved job reports and timelines (updated at each Tick).
  int64_t reports_charged_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Counted by Snapshot(), which is const: scrapes only read the state otherwise.
  mutable std::atomic<uint64_t> rank_series_dropped_{0};
  // Reused for every step so that conversion does not allocate per step.
  analysis::StepEvent scratch_step_ ABSL_GUARDED_BY(mu_);
  // Internally synchronized; taken after mu_, never before.
  ReportStore reports_;

  // A copy of counters_ and accounted_bytes_ made at the end of each Apply; held only to copy.
  mutable absl::Mutex counters_mu_ ABSL_ACQUIRED_AFTER(mu_);
  CollectorCounters live_counters_ ABSL_GUARDED_BY(counters_mu_);
  int64_t live_accounted_bytes_ ABSL_GUARDED_BY(counters_mu_) = 0;

  // The view readers answer from, swapped whole at each Tick; held only to copy the pointer.
  // Serializes ticks; taken before mu_.
  absl::Mutex tick_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // When every job's rank rows were last rebuilt (steady clock) and what that cost.
  std::chrono::steady_clock::time_point rank_rows_built_at_ ABSL_GUARDED_BY(tick_mu_);
  int64_t rank_rows_cost_nanos_ ABSL_GUARDED_BY(tick_mu_) = 0;
  mutable absl::Mutex published_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::shared_ptr<const PublishedState> published_ ABSL_GUARDED_BY(published_mu_);
};

}  // namespace stepwatch::collector
