// CollectorState's construction, counters and ticker (advance, expiry, publication); ingest is in
// ingest.cc, admission in admission.cc, the budget in memory_budget.cc, the read view in
// published_state.cc and the query answers in queries.cc.
#include "collector/state.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collector/queries.h"
#include "common/log.h"

namespace stepwatch::collector {
namespace {

// A running report loaded at start expires as the job would have: unseen for --expire.
ReportStoreOptions ReportOptionsFor(const CollectorStateOptions& options) {
  ReportStoreOptions o = options.reports;
  o.recovered_expire_nanos = options.expire_nanos;
  return o;
}

}  // namespace

CollectorState::CollectorState(CollectorStateOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      engine_(options_.engine),
      deduper_(options_.dedupe),
      costs_(MemoryCostsFor(options_.engine)),
      reports_(ReportOptionsFor(options_)) {
  // Never fatal: without its directory the collector still keeps reports in memory.
  if (absl::Status st = reports_.Load(clock_->NowUnixNanos()); !st.ok()) {
    SW_LOG_WARNING << "job reports will not survive a restart: " << st;
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status st = deduper_.OpenJournal(); !st.ok()) {
      SW_LOG_WARNING << "batch deduplication journal: " << st;
    }
    counters_.journal_records_damaged = deduper_.journal_damaged_records();
    SyncCounters();
  }
  // Readers never see null: an empty view until the first Tick.
  auto empty = std::make_shared<PublishedState>();
  empty->snapshot.now_unix_nanos = clock_->NowUnixNanos();
  empty->snapshot.node_down_nanos = options_.node_down_nanos;
  empty->snapshot.memory_budget_bytes = options_.max_memory_bytes;
  Publish(std::move(empty));
}

void CollectorState::Publish(std::shared_ptr<const PublishedState> view) {
  std::shared_ptr<const PublishedState> old;
  {
    absl::MutexLock lock(&published_mu_);
    old = std::move(published_);
    published_ = std::move(view);
  }
  // `old` is freed here, outside the lock, when no reader holds it any more.
}

void CollectorState::SyncCounters() {
  absl::MutexLock lock(&counters_mu_);
  live_counters_ = counters_;
  live_accounted_bytes_ = accounted_bytes_;
}

std::shared_ptr<const PublishedState> CollectorState::Published() const {
  absl::MutexLock lock(&published_mu_);
  return published_;
}

void CollectorState::CountRefused(const char* reason) {
  absl::MutexLock lock(&mu_);
  ++counters_.refused[reason];
  SyncCounters();
}

void CollectorState::CountIngestError() {
  absl::MutexLock lock(&mu_);
  ++counters_.ingest_errors;
  SyncCounters();
}

void CollectorState::CountMalformed(const char* reason, const FieldProblem* field) {
  absl::MutexLock lock(&mu_);
  ++counters_.ingest_errors;
  ++counters_.malformed[reason];
  if (field != nullptr) ++counters_.fields_refused[{field->field, field->reason}];
  SyncCounters();
}

void CollectorState::CountStateSaveError() {
  absl::MutexLock lock(&mu_);
  ++counters_.state_save_errors;
  SyncCounters();
}

int64_t CollectorState::MemoryAccountedBytes() const {
  absl::MutexLock lock(&mu_);
  return accounted_bytes_;
}

void CollectorState::Tick() {
  const int64_t now = clock_->NowUnixNanos();
  AdvanceExpireAndPublish(now);
  reports_.Prune(now);
  // Outside mu_: disk latency must not hold up ingest.
  const int failures = reports_.Flush(now);
  // Reports the disk did not take stay in memory: they count against the budget meanwhile, as
  // the jobs' timelines do.
  const int64_t charged = reports_.unsaved_bytes() + reports_.timeline_bytes();
  absl::MutexLock lock(&mu_);
  counters_.state_save_errors += failures;
  accounted_bytes_ += charged - reports_charged_bytes_;
  reports_charged_bytes_ = charged;
  SyncCounters();
}

void CollectorState::ObserveReports(const std::vector<analysis::JobSnapshot>& jobs,
                                    const std::vector<analysis::Finding>& findings, int64_t now) {
  absl::flat_hash_map<std::string, std::vector<analysis::Finding>> by_job;
  for (const analysis::Finding& f : findings) {
    if (!f.job.empty()) by_job[f.job].push_back(f);
  }
  const std::vector<analysis::Finding> none;
  for (const analysis::JobSnapshot& job : jobs) {
    auto found = by_job.find(job.job);
    reports_.Observe(job, found == by_job.end() ? none : found->second, SpanOf(job.job), now,
                     AttributionNow());
  }
}

void CollectorState::FinishReport(const analysis::JobSnapshot& job,
                                  const std::vector<analysis::Finding>& findings,
                                  const char* reason, int64_t now) {
  reports_.Finish(job, findings, SpanOf(job.job), reason, now, AttributionNow());
}

JobSpan CollectorState::SpanOf(const std::string& job) const {
  auto track = jobs_.find(job);
  if (track == jobs_.end()) return JobSpan{};
  return JobSpan{track->second.first_step, track->second.first_seen_unix_nanos};
}

void CollectorState::AdvanceExpireAndPublish(int64_t now) {
  absl::MutexLock tick_lock(&tick_mu_);
  const int64_t cutoff = now - options_.expire_nanos;
  auto view = std::make_shared<PublishedState>();
  StateSnapshot& s = view->snapshot;
  const auto locked_at = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    engine_.Advance(now);
    // One evaluation per tick serves the reports, the expired jobs' reports and the view.
    std::vector<analysis::JobSnapshot> jobs = engine_.Jobs();
    std::vector<analysis::Finding> findings = engine_.Findings();
    ObserveReports(jobs, findings, now);
    const bool expired = ExpireJobs(jobs, findings, cutoff, now);
    const bool nodes_removed = ExpireNodes(cutoff);

    // The view: what the engine holds now.
    const auto build_at = std::chrono::steady_clock::now();
    if (expired || nodes_removed) {
      jobs = engine_.Jobs();
      findings = engine_.Findings();
    }
    s.jobs = std::move(jobs);
    s.findings = std::move(findings);
    s.nodes.reserve(nodes_.size());
    for (const auto& [name, track] : nodes_) s.nodes.push_back(track.view);
    s.counters = counters_;
    SyncCounters();
    s.memory_accounted_bytes = accounted_bytes_;
    s.detector_timings = engine_.DetectorTimings();
    s.rank_pods = PublishedRankPods();
    view->build_locked_nanos = NanosSince(build_at);
  }
  view->tick_locked_nanos = NanosSince(locked_at);
  view->longest_hold_nanos = view->tick_locked_nanos;
  s.now_unix_nanos = now;
  s.node_down_nanos = options_.node_down_nanos;
  s.memory_budget_bytes = options_.max_memory_bytes;
  s.nodes_tracked = s.nodes.size();
  // Outside the ingest mutex.
  IndexView(view.get());
  PublishRankRows(view.get());
  // Timelines sample rows just rebuilt (shared older rows would repeat a sample), after the view
  // is out: readers need not wait for them.
  const std::shared_ptr<const PublishedState> published = view;
  Publish(std::move(view));
  if (published->rank_rows_rebuilt) {
    // The timelines may grow into half of what the budget has left, held for them while they
    // sample outside the lock (ingest keeps the other half), and are charged before the hold is
    // given back: ingest and timelines together never pass the budget.
    int64_t room = std::numeric_limits<int64_t>::max();
    int64_t held = 0;
    if (options_.max_memory_bytes > 0) {
      absl::MutexLock lock(&mu_);
      room = std::max<int64_t>(0, options_.max_memory_bytes - accounted_bytes_) / 2;
      held = room;
      accounted_bytes_ += held;
    }
    reports_.SampleTimelines(*published, now, room);
    if (options_.max_memory_bytes > 0) {
      const int64_t charged = reports_.unsaved_bytes() + reports_.timeline_bytes();
      absl::MutexLock lock(&mu_);
      accounted_bytes_ += charged - reports_charged_bytes_ - held;
      reports_charged_bytes_ = charged;
      SyncCounters();
    }
  }
}

bool CollectorState::ExpireJobs(const std::vector<analysis::JobSnapshot>& jobs,
                                const std::vector<analysis::Finding>& findings, int64_t cutoff,
                                int64_t now) {
  bool expired = false;
  for (const analysis::JobSnapshot& snap : jobs) {
    auto it = jobs_.find(snap.job);
    if (it == jobs_.end() || it->second.last_seen_unix_nanos >= cutoff) continue;
    SW_LOG_INFO << "job " << snap.job << " unseen for " << options_.expire_nanos / 1'000'000'000
                << " s: forgetting it";
    std::vector<analysis::Finding> own;
    for (const analysis::Finding& f : findings) {
      if (f.job == snap.job) own.push_back(f);
    }
    FinishReport(snap, own, "expired", now);
    engine_.RemoveJob(snap.job);
    ++counters_.expired["job"];
    EraseJob(snap.job);
    expired = true;
  }
  return expired;
}

bool CollectorState::ExpireNodes(int64_t cutoff) {
  bool nodes_removed = false;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (it->second.view.last_seen_unix_nanos < cutoff) {
      SW_LOG_INFO << "node " << it->first << " unseen for " << options_.expire_nanos / 1'000'000'000
                  << " s: forgetting it";
      engine_.RemoveNode(it->first);
      deduper_.ForgetAgent(it->second.view.agent_id);
      ++counters_.expired["node"];
      it = EraseNode(it);
      nodes_removed = true;
    } else {
      ++it;
    }
  }
  // The engine forgot the ranks of removed nodes: so do the charges.
  if (nodes_removed) RefundForgottenRanks();
  return nodes_removed;
}

void CollectorState::RunWithIngestLockHeldForTest(const std::function<void()>& fn) {
  absl::MutexLock lock(&mu_);
  fn();
}

v1::StatusResponse CollectorState::Status() const {
  return StatusAnswer(*Published(), options_.max_answer_bytes);
}

v1::FindingsResponse CollectorState::Findings(absl::string_view job) const {
  return FindingsAnswer(*Published(), job, options_.max_answer_bytes);
}

absl::StatusOr<v1::ExplainResponse> CollectorState::Explain(absl::string_view job) const {
  return ExplainAnswer(*Published(), job);
}

StateSnapshot CollectorState::Snapshot(NodeScope scope) const {
  const std::shared_ptr<const PublishedState> view = Published();
  const int64_t now = clock_->NowUnixNanos();
  StateSnapshot s = CopySnapshot(*view, scope, now);
  {
    absl::MutexLock lock(&counters_mu_);
    s.counters = live_counters_;
    s.memory_accounted_bytes = live_accounted_bytes_;
  }
  s.now_unix_nanos = now;
  s.agents_connected = agents_connected_.load();
  s.reports_unsaved = reports_.unsaved_count();
  s.reports_unsaved_bytes = reports_.unsaved_bytes();
  s.report_save_errors = reports_.save_errors();
  s.counters.rank_series_dropped =
      rank_series_dropped_.fetch_add(view->rank_series_dropped) + view->rank_series_dropped;
  return s;
}

std::string CollectorState::SerializeScalingHistory() const {
  absl::MutexLock lock(&mu_);
  return engine_.SerializeScalingHistory();
}

absl::Status CollectorState::LoadScalingHistory(absl::string_view data) {
  absl::MutexLock lock(&mu_);
  return engine_.LoadScalingHistory(data);
}

}  // namespace stepwatch::collector
