// The collector's state: the analysis engine behind a mutex, the last readings of every node, batch
// deduplication, limits, expiry and the collector's own counters. Thread-safe; gRPC reactors, the
// ticker thread and /metrics scrapes all go through it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "analysis/engine.h"
#include "collector/dedupe.h"
#include "common/clock.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

struct CollectorStateOptions {
  analysis::EngineOptions engine;
  // Jobs and nodes unseen for this long are forgotten, with their series.
  int64_t expire_nanos = 300'000'000'000;
  // A node is reported down (stepwatch_node_up 0) when unseen for this long.
  int64_t node_down_nanos = 15'000'000'000;
  // Limits; what would exceed one is dropped and counted in limit_hits{limit}.
  int max_jobs = 1000;
  int max_ranks_per_job = 65536;
  int max_nodes = 10000;
  int max_gpus_per_node = 64;
  // Per job, the ranks furthest above their peers' median busy time exported per rank on /metrics
  // (flagged ranks are exported anyway, through stepwatch_straggler).
  int top_ranks_per_job = 5;
  DeduperOptions dedupe;
};

// The last known state of one node (one agent).
struct NodeView {
  std::string node;
  std::string agent_id;
  int64_t last_seen_unix_nanos = 0;
  v1::NodeInfo info;
  std::vector<v1::GpuSample> gpus;  // the last sample of each GPU, by index
  std::optional<v1::HostSample> host;
};

struct CollectorCounters {
  uint64_t batches_received = 0;
  uint64_t duplicate_batches = 0;
  uint64_t steps_received = 0;
  uint64_t gpu_samples_received = 0;
  uint64_t host_samples_received = 0;
  uint64_t ingest_errors = 0;
  uint64_t state_save_errors = 0;
  std::map<std::string, uint64_t> steps_rejected;  // by reason: "invalid", "limit"
  std::map<std::string, uint64_t> limit_hits;      // by limit: "jobs", "ranks_per_job", ...
  std::map<std::string, uint64_t> expired;         // by kind: "job", "node"
  uint64_t rank_exits_received = 0;
  // Jobs ended because every reporting rank's process exited (ReportBatch.rank_exits).
  uint64_t jobs_finished = 0;
};

// Everything /metrics shows, copied under the lock at scrape time.
struct StateSnapshot {
  int64_t now_unix_nanos = 0;
  int64_t node_down_nanos = 0;
  std::vector<analysis::JobSnapshot> jobs;
  std::vector<analysis::Finding> findings;
  // Per job (in `jobs` order), its top_ranks_per_job slowest ranks, slowest first.
  std::vector<std::pair<std::string, analysis::RankSnapshot>> top_ranks;
  std::vector<NodeView> nodes;  // ordered by node name
  CollectorCounters counters;
  int agents_connected = 0;
};

class CollectorState {
 public:
  CollectorState(CollectorStateOptions options, const Clock* clock);
  CollectorState(const CollectorState&) = delete;
  CollectorState& operator=(const CollectorState&) = delete;

  // Applies one batch (unless it is a duplicate) and returns the acknowledgement to send. Its
  // steps go to the engine first, then its samples, then its rank exits: a job whose reporting
  // ranks have all exited has finished and is forgotten at once (logged once).
  // InvalidArgument when the batch lacks agent_id, boot_id or seq.
  absl::StatusOr<v1::IngestAck> Apply(const v1::ReportBatch& batch);

  // Runs the engine's time-driven parts and expires jobs and nodes unseen for `expire`.
  void Tick();

  void AgentConnected() { agents_connected_.fetch_add(1); }
  void AgentDisconnected() { agents_connected_.fetch_sub(1); }
  void CountIngestError();
  void CountStateSaveError();

  v1::StatusResponse Status() const;
  // Empty `job`: every job's findings (idle GPUs included).
  v1::FindingsResponse Findings(absl::string_view job) const;
  // NotFound for an unknown job.
  absl::StatusOr<v1::ExplainResponse> Explain(absl::string_view job) const;
  StateSnapshot Snapshot() const;

  std::string SerializeScalingHistory() const;
  absl::Status LoadScalingHistory(absl::string_view data);

 private:
  struct JobTrack {
    int64_t last_seen_unix_nanos = 0;
    absl::flat_hash_set<int> ranks;
  };
  struct NodeTrack {
    NodeView view;
    absl::flat_hash_map<int, size_t> gpu_slot;  // index -> position in view.gpus
  };

  // Returns false (and counts) when the step would exceed a limit.
  bool AdmitStep(const v1::StepEvent& event, int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeTrack* TouchNode(const v1::ReportBatch& batch, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CollectorStateOptions options_;
  const Clock* const clock_;
  std::atomic<int> agents_connected_{0};

  mutable absl::Mutex mu_;
  analysis::Engine engine_ ABSL_GUARDED_BY(mu_);
  BatchDeduper deduper_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, JobTrack> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NodeTrack> nodes_ ABSL_GUARDED_BY(mu_);
  CollectorCounters counters_ ABSL_GUARDED_BY(mu_);
  // Reused for every step so that conversion does not allocate per step.
  analysis::StepSample scratch_step_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stepwatch::collector
