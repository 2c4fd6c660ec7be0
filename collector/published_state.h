// The collector's read side: the immutable state each Tick() publishes (jobs, findings, rank rows,
// nodes, counters), a copy, and the pure functions that build and copy it. Readers never take the
// ingest mutex: they answer from a published state (see collector/queries.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "analysis/engine.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

class PodIndex;  // collector/pod_index.h

// The last known state of one node (one agent).
struct NodeSnapshot {
  std::string node;
  std::string agent_id;
  int64_t last_seen_unix_nanos = 0;
  v1::NodeInfo info;
  std::vector<v1::GpuSample> gpus;  // the last sample of each GPU, by index
  std::optional<v1::HostSample> host;
};

// Nodes named in CollectorCounters::node_refusals (the rest are counted as node "_other").
inline constexpr size_t kMaxRefusalNodes = 64;

struct CollectorCounters {
  uint64_t batches_received = 0;
  uint64_t duplicate_batches = 0;
  uint64_t steps_received = 0;
  uint64_t gpu_samples_received = 0;
  uint64_t host_samples_received = 0;
  uint64_t ingest_errors = 0;
  uint64_t state_save_errors = 0;
  // Damaged records skipped when the deduplication journal was opened at start.
  uint64_t journal_records_damaged = 0;
  std::map<std::string, uint64_t> steps_rejected;  // by reason: "invalid", "limit"
  std::map<std::string, uint64_t> limit_hits;      // by limit: "jobs", "ranks_per_job", ...
  std::map<std::string, uint64_t> expired;         // by kind: "job", "node"
  // Calls and batches refused: "unauthenticated", "permission_denied", "node_mismatch",
  // "no_identity" (a client certificate that names no usable node), "rank_exit_foreign" (a node
  // reported the exit of a rank it does not hold), "rank_foreign" (a step of a rank another node
  // holds), "job_foreign" (a step that would rescale a job whose ranks run on other nodes).
  std::map<std::string, uint64_t> refused;
  // The refusals that one node caused, by (node, reason): rank_foreign, job_foreign,
  // rank_exit_foreign, jobs_per_node. At most kMaxRefusalNodes nodes are named; the others are
  // counted under node "_other".
  std::map<std::pair<std::string, std::string>, uint64_t> node_refusals;
  // Batches refused before anything of them was applied, by reason: "unparsable" (not a
  // ReportBatch protobuf), "missing_field" (no agent_id, boot_id or seq), "bad_field" (an
  // identifier over its bound or with control characters, see collector/convert.h).
  std::map<std::string, uint64_t> malformed;
  // Fields over their bound or with control characters, by (field, reason: "too_long",
  // "control_character"): an identifier costs its batch, any other field the item holding it.
  std::map<std::pair<std::string, std::string>, uint64_t> fields_refused;
  // Ranks taken over by another node after their holder went silent for --expire or its process
  // exited (or the job moved away from it).
  uint64_t rank_takeovers = 0;
  uint64_t rank_exits_received = 0;
  // Sender timestamps replaced because they were beyond max_clock_skew of the collector's clock.
  uint64_t clock_skew_corrected = 0;
  // Jobs ended because every reporting rank's process exited (ReportBatch.rank_exits).
  uint64_t jobs_finished = 0;
  // Jobs forgotten because every rank moved to other collectors (ReportBatch.released_jobs).
  uint64_t jobs_moved_away = 0;
  // Ranks left out of the per-rank series by max_rank_series, summed over scrapes.
  uint64_t rank_series_dropped = 0;
  // Findings left out of stepwatch_finding by MetricsOptions::max_finding_series, summed over
  // scrapes (counted by the /metrics collectable).
  uint64_t finding_series_dropped = 0;
  // Series left out by the /metrics total cap (MetricsOptions::max_series), by family ("job",
  // "rank", "finding", "node", "gpu", "host"), summed over scrapes (counted by the collectable).
  std::map<std::string, uint64_t> series_dropped;
};

// What current findings point at on one node: their GPUs, or every GPU of the node.
struct InvolvedNode {
  bool every_gpu = false;
  std::set<int> gpus;
};

// The nodes and GPUs that `findings` are about, by node name: a finding's node with its GPU, or
// every GPU of the node when the finding names none (a slow node: its detector weighs every GPU
// of the node's ranks, and one throttled GPU may be the whole story), and every device of its
// evidence. A pipeline imbalance names a node only when its slowest stage runs on one (else the
// stage's work, not a machine, is the suspect); job-level findings (scaling, regression, stall)
// name none. At most one entry per finding's node and device, so bounded by the findings.
std::map<std::string, InvolvedNode> InvolvedNodes(const std::vector<analysis::Finding>& findings);

// Which nodes a snapshot copies: all of them, or only those named by current findings
// (InvolvedNodes) and those gone quiet (not seen for node_down_nanos), so that a scrape's work
// follows what it exports, not the size of the fleet.
enum class NodeScope { kAll, kInvolved };

// Everything /metrics shows: built at each Tick() (see PublishedState), copied at scrape time; the
// counters and the memory accounted alone are those of the last batch applied.
struct StateSnapshot {
  int64_t now_unix_nanos = 0;
  int64_t node_down_nanos = 0;
  std::vector<analysis::JobSnapshot> jobs;
  std::vector<analysis::Finding> findings;
  // The ranks with per-rank series (job, rank): every flagged rank, then each job's
  // top_ranks_per_job slowest, at most max_rank_series in all.
  std::vector<std::pair<std::string, analysis::RankSnapshot>> top_ranks;
  // Ordered by node name: every node tracked, or under NodeScope::kInvolved only those involved.
  std::vector<NodeSnapshot> nodes;
  // Nodes tracked, whichever of them `nodes` holds (0 in snapshots built by hand: nodes.size()).
  size_t nodes_tracked = 0;
  CollectorCounters counters;
  int agents_connected = 0;
  // Bytes charged against the memory budget, and the budget (0: none).
  int64_t memory_accounted_bytes = 0;
  int64_t memory_budget_bytes = 0;
  // Finished job reports not yet written under --state-dir (charged against the budget), and the
  // report writes that failed (read live by Snapshot()).
  int reports_unsaved = 0;
  int64_t reports_unsaved_bytes = 0;
  uint64_t report_save_errors = 0;
  // Cumulative time the engine spent in each detector.
  std::map<std::string, analysis::DetectorTiming> detector_timings;
  // The pod of each rank whose steps name one (shared between views until it changes); null:
  // none known.
  std::shared_ptr<const PodIndex> rank_pods;
};

// What readers see: built at the end of each Tick() and never changed after it is published.
// `snapshot.now_unix_nanos` is the time of that Tick.
struct PublishedState {
  StateSnapshot snapshot;
  // Every job's ranks (for Explain), by job name. Shared with the previous view when they were not
  // rebuilt at this tick (see AdvanceExpireAndPublish).
  absl::flat_hash_map<std::string, std::shared_ptr<const std::vector<analysis::RankSnapshot>>>
      ranks;
  // Active findings per job name.
  absl::flat_hash_map<std::string, int> findings_per_job;
  // Positions in snapshot.nodes, least recently seen first: a scrape finds the quiet nodes by
  // walking only as far as they go.
  std::vector<uint32_t> nodes_by_last_seen;
  // Ranks left out of snapshot.top_ranks by max_rank_series (counted per scrape).
  uint64_t rank_series_dropped = 0;
  // Where the time of the Tick that built this view went: its main hold of the ingest mutex
  // (advance, expiry, findings, jobs, nodes), the part of that spent copying for this view, the
  // rank rows (built in slices, each its own hold), the longest single hold, and the work done
  // outside the mutex (the per-rank series selection).
  int64_t tick_locked_nanos = 0;
  int64_t build_locked_nanos = 0;
  int64_t rank_rows_locked_nanos = 0;
  int64_t longest_hold_nanos = 0;
  int64_t build_unlocked_nanos = 0;
  // Whether this tick rebuilt every job's rank rows (else it shared the previous view's).
  bool rank_rows_rebuilt = false;
};

// Fills view->findings_per_job and view->nodes_by_last_seen from view->snapshot.
void IndexView(PublishedState* view);

// Fills view->snapshot.top_ranks, the ranks that get per-rank series (see
// CollectorStateOptions::max_rank_series), from view->ranks, and view->rank_series_dropped.
void SelectRankSeries(int top_ranks_per_job, int max_rank_series, PublishedState* view);

// A copy of `view`'s snapshot with every node (NodeScope::kAll) or only those involved in findings
// or quiet at `now` (NodeScope::kInvolved); the caller fills in the live counters.
StateSnapshot CopySnapshot(const PublishedState& view, NodeScope scope, int64_t now);

// Steady-clock nanoseconds since `start`, for the view's timings.
int64_t NanosSince(std::chrono::steady_clock::time_point start);

}  // namespace stepwatch::collector
