#include "collector/state.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collector/convert.h"
#include "common/log.h"
#include "common/text.h"

namespace stepwatch::collector {
namespace {

// Label values (job, node) are bounded: longer ones are refused, not truncated, so that two
// distinct names cannot collide. Names also reach terminals: no control characters. Every string
// a batch carries is bounded the same way (collector/convert.h, CheckBatchIdentifiers and the
// checks of its items).

// Copies of a job's name the collector keeps beside its per-rank ones: the engine's registry key
// and record, the collector's track, the running report, the scaling history, its findings.
constexpr int64_t kJobNameCopies = 6;
// Copies of a node's name: the node map's key, its view and node info, the engine's node index,
// host record and the name of the job-per-node count.
constexpr int64_t kNodeNameCopies = 6;

// Rank rows built per hold of the ingest mutex (see AdvanceExpireAndPublish).
constexpr int kRankRowsPerHold = 4096;
// Rank rows (four medians over every rank's window) cost about 3 us per rank: rebuilt at every
// tick while that is under kRankRowsAlwaysRebuildNanos, else once kRankRowsCostMultiple times
// their cost has passed, so that they take at most ~5% of a core (100,000 ranks: every ~6 s).
constexpr int64_t kRankRowsAlwaysRebuildNanos = 5'000'000;
constexpr int64_t kRankRowsCostMultiple = 20;

// A running report loaded at start expires as the job would have: unseen for --expire.
ReportStoreOptions ReportOptionsFor(const CollectorStateOptions& options) {
  ReportStoreOptions o = options.reports;
  o.recovered_expire_nanos = options.expire_nanos;
  return o;
}

std::string BadIdentifierMessage(const FieldProblem& bad) {
  size_t bound = kMaxNodeNameBytes;
  if (std::string(bad.field) == "boot_id") bound = kMaxBootIdBytes;
  return std::string(bad.reason) == "too_long"
             ? absl::StrCat("ReportBatch ", bad.field, " longer than ", bound, " bytes")
             : absl::StrCat("ReportBatch ", bad.field, " with control characters");
}

int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

}  // namespace

std::map<std::string, InvolvedNode> InvolvedNodes(const std::vector<analysis::Finding>& findings) {
  std::map<std::string, InvolvedNode> out;
  for (const analysis::Finding& f : findings) {
    if (!f.node.empty()) {
      InvolvedNode& n = out[f.node];
      if (f.gpu >= 0) {
        n.gpus.insert(f.gpu);
      } else {
        n.every_gpu = true;
      }
    }
    for (const analysis::DeviceEvidence& d : f.evidence.devices) {
      if (d.node.empty()) continue;
      InvolvedNode& n = out[d.node];
      if (d.gpu >= 0) n.gpus.insert(d.gpu);
    }
  }
  return out;
}

MemoryCosts MemoryCostsFor(const analysis::EngineOptions& engine) {
  // Heap bytes measured by bench/collector/memory_cost_bench.cc (glibc malloc, x86-64, default
  // engine options), rounded up; re-measure when the engine's per-rank state changes. A rank is
  // charged its worst case: its state, its windows (window_steps step values, straggler_window
  // scores), its collector and per-node index entries, and a pending entry for each of the
  // max_pending_steps steps that may wait for completion. Measured: 2.1 KiB for a rank whose
  // steps complete, 9.5 KiB for one with 64 steps pending, 1.4 KiB after one step.
  constexpr int64_t kJobBytes = 4096;
  constexpr int64_t kJobPerWindowStepBytes = 64;  // the job's summaries window
  constexpr int64_t kRankSlotBytes = 8;           // one pointer per unit of world_size
  constexpr int64_t kRankBaseBytes = 384;
  constexpr int64_t kRankPerWindowStepBytes = 16;
  constexpr int64_t kRankPerScoreBytes = 48;
  constexpr int64_t kRankPerPendingStepBytes = 128;
  constexpr int64_t kNodeBytes = 1024;  // measured 0.8 KiB with a host sample
  constexpr int64_t kGpuBytes = 1536;   // measured 1.1 KiB with every NVML and GPM field
  const int64_t window = std::max(engine.window_steps, 4);
  const int64_t scores = std::max(engine.straggler_window, 4);
  const int64_t pending = std::max(engine.max_pending_steps, 1);
  MemoryCosts c;
  c.job = kJobBytes + window * kJobPerWindowStepBytes;
  c.rank_slot = kRankSlotBytes;
  c.rank = kRankBaseBytes + window * kRankPerWindowStepBytes + scores * kRankPerScoreBytes +
           pending * kRankPerPendingStepBytes;
  c.node = kNodeBytes;
  c.gpu = kGpuBytes;
  return c;
}

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
  auto empty = std::make_shared<PublishedView>();
  empty->snapshot.now_unix_nanos = clock_->NowUnixNanos();
  empty->snapshot.node_down_nanos = options_.node_down_nanos;
  empty->snapshot.memory_budget_bytes = options_.max_memory_bytes;
  Publish(std::move(empty));
}

void CollectorState::Publish(std::shared_ptr<const PublishedView> view) {
  std::shared_ptr<const PublishedView> old;
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

std::shared_ptr<const PublishedView> CollectorState::Published() const {
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

void CollectorState::CountNodeRefusal(const std::string& node, const char* reason) {
  ++counters_.refused[reason];
  std::pair<std::string, std::string> key(node, reason);
  if (counters_.node_refusals.find(key) == counters_.node_refusals.end()) {
    // A new node is named only while fewer than kMaxRefusalNodes are.
    size_t nodes = 0;
    const std::string* last = nullptr;
    for (const auto& [k, n] : counters_.node_refusals) {
      if (last == nullptr || k.first != *last) ++nodes;
      last = &k.first;
    }
    const bool named = std::any_of(counters_.node_refusals.begin(), counters_.node_refusals.end(),
                                   [&](const auto& e) { return e.first.first == node; });
    if (!named && nodes >= kMaxRefusalNodes) key.first = "_other";
  }
  ++counters_.node_refusals[key];
}

void CollectorState::CountFieldRefused(const FieldProblem& problem, absl::string_view node,
                                       const char* what) {
  ++counters_.fields_refused[{problem.field, problem.reason}];
  uint64_t suppressed = 0;
  if (field_log_limiter_.Allow(&suppressed)) {
    SW_LOG_WARNING << "node " << EscapeControlCharacters(node.substr(0, kMaxNodeNameBytes))
                   << ": refusing a " << what << " whose " << problem.field << " is "
                   << (std::string(problem.reason) == "too_long" ? "over its bound"
                                                                 : "holding control characters")
                   << " (docs/security.md, \"Identity and admission\")"
                   << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                      : std::string());
  }
}

int64_t CollectorState::NodeTextBytes(const NodeView& v) {
  return kNodeNameCopies * StringHeapBytes(v.node) + StringHeapBytes(v.agent_id) +
         KeptBytes(v.info) + (v.host.has_value() ? KeptBytes(*v.host) : 0);
}

int64_t CollectorState::GpuBytes(const v1::GpuSample& sample, const std::string& node) const {
  return costs_.gpu + KeptBytes(sample) + StringHeapBytes(node);
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

bool CollectorState::Charge(int64_t bytes, const char* what) {
  if (options_.max_memory_bytes > 0 && accounted_bytes_ + bytes > options_.max_memory_bytes) {
    ++counters_.limit_hits["memory"];
    uint64_t suppressed = 0;
    if (memory_log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "memory budget of " << (options_.max_memory_bytes >> 20)
                     << " MiB reached: refusing a new " << what
                     << "; tracked jobs and nodes are still analysed (--max-memory-mib)"
                     << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                        : std::string());
    }
    return false;
  }
  accounted_bytes_ += bytes;
  return true;
}

void CollectorState::EraseJob(const std::string& job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  accounted_bytes_ -= it->second.charged_bytes;
  if (!it->second.opened_by.empty()) {
    auto opened = jobs_opened_.find(it->second.opened_by);
    if (opened != jobs_opened_.end() && --opened->second <= 0) jobs_opened_.erase(opened);
  }
  jobs_.erase(it);
}

void CollectorState::HitLimit(const char* limit) {
  ++counters_.limit_hits[limit];
  std::unique_ptr<LogRateLimiter>& limiter = limit_log_limiters_[limit];
  // The first refusal is logged, then at most one line a minute per limit.
  if (limiter == nullptr) limiter = std::make_unique<LogRateLimiter>(1, std::chrono::minutes(1));
  uint64_t suppressed = 0;
  if (!limiter->Allow(&suppressed)) return;
  const analysis::EngineOptions& e = engine_.options();
  const std::string name = limit;
  int value = 0;
  const char* flag = "";
  const char* refused = "";
  if (name == "jobs") {
    value = e.max_jobs;
    flag = "--max-jobs";
    refused = "steps of new jobs";
  } else if (name == "jobs_per_node") {
    value = options_.max_jobs_per_node;
    flag = "--max-jobs-per-node";
    refused = "steps of new jobs opened by a node that opened that many";
  } else if (name == "ranks_per_job") {
    value = e.max_ranks_per_job;
    flag = "--max-ranks-per-job";
    refused = "steps of larger jobs";
  } else if (name == "nodes") {
    value = options_.max_nodes;
    flag = "--max-nodes";
    refused = "samples of new nodes";
  } else if (name == "gpus_per_node") {
    value = options_.max_gpus_per_node;
    flag = "--max-gpus-per-node";
    refused = "samples of further GPUs";
  }
  SW_LOG_WARNING << "limit " << name << " of " << value << " reached: dropping " << refused
                 << " (raise it with " << flag << ")"
                 << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                    : std::string());
}

CollectorState::Admission CollectorState::AdmitStep(const v1::StepEvent& event,
                                                    const std::string& node, int64_t now) {
  Admission a;
  const analysis::EngineOptions& limits = engine_.options();
  if (event.world_size() > limits.max_ranks_per_job) {
    HitLimit("ranks_per_job");
    return a;
  }
  // The engine's registry says which jobs and ranks exist, and which node holds each rank (the
  // one its last step came from); the track keeps only the charges.
  const std::optional<analysis::JobHolding> held = engine_.JobHoldingOf(event.job());
  auto it = jobs_.find(event.job());
  if (!held.has_value()) {
    if (it != jobs_.end()) EraseJob(event.job());  // never left behind; defensive
    if (engine_.JobCount() >= static_cast<size_t>(std::max(0, limits.max_jobs))) {
      HitLimit("jobs");
      return a;
    }
    auto opened = jobs_opened_.find(node);
    if (options_.max_jobs_per_node > 0 && opened != jobs_opened_.end() &&
        opened->second >= options_.max_jobs_per_node) {
      HitLimit("jobs_per_node");
      CountNodeRefusal(node, "jobs_per_node");
      return a;
    }
    const int64_t rank_bytes = costs_.rank + StringHeapBytes(event.job()) + StringHeapBytes(node);
    const int64_t cost = costs_.job + kJobNameCopies * StringHeapBytes(event.job()) +
                         StringHeapBytes(node) + costs_.rank_slot * event.world_size() + rank_bytes;
    if (!Charge(cost, "job")) return a;
    it = jobs_.emplace(event.job(), JobTrack{}).first;
    it->second.world_size_charged = event.world_size();
    it->second.ranks_charged = 1;
    it->second.charged_bytes = cost;
    it->second.rank_bytes = rank_bytes;
    it->second.opened_by = node;
    ++jobs_opened_[node];
    a.new_job = true;
    a.bytes = cost;
    a.ranks = 1;
  } else {
    // A rank is bound to the node that holds it while that node keeps reporting it: another
    // node's step for it would be a forgery (a false straggler, or the first half of ending the
    // job with forged exits). It moves once its holder has been silent for expire_nanos (the
    // holder's node is then forgotten too), or its process exited or moved away.
    const int64_t held_since = now - options_.expire_nanos;
    const std::optional<analysis::RankHolder> holder =
        engine_.RankHolderOf(event.job(), event.rank());
    const bool holds_this_rank = holder.has_value() && holder->node == node;
    if (holder.has_value() && !holds_this_rank) {
      if (!holder->exited && holder->last_seen_unix_nanos >= held_since) {
        CountNodeRefusal(node, "rank_foreign");
        uint64_t suppressed = 0;
        if (foreign_log_limiter_.Allow(&suppressed)) {
          SW_LOG_WARNING << "refusing steps of job " << event.job() << " rank " << event.rank()
                         << " from node " << node << ": node " << holder->node
                         << " holds that rank and still reports it"
                         << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                            : std::string());
        }
        a.rejected = "foreign";
        return a;
      }
      a.takeover = true;
    }
    // A new world size resets the job (a rescale): only a node that holds one of its ranks may do
    // that while other nodes' ranks still run it.
    if (event.world_size() != held->world_size && !holds_this_rank && held->running_ranks > 0 &&
        held->last_seen_unix_nanos >= held_since && !engine_.NodeHoldsRankOf(event.job(), node)) {
      CountNodeRefusal(node, "job_foreign");
      uint64_t suppressed = 0;
      if (foreign_log_limiter_.Allow(&suppressed)) {
        SW_LOG_WARNING << "refusing steps of job " << event.job() << " from node " << node
                       << ": world size " << event.world_size() << " would reset the job (world "
                       << held->world_size << ") whose running ranks are all on other nodes"
                       << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                          : std::string());
      }
      a.rejected = "foreign";
      return a;
    }
    if (it == jobs_.end()) {
      it = jobs_.emplace(event.job(), JobTrack{}).first;
      it->second.rank_bytes = costs_.rank + StringHeapBytes(event.job()) + StringHeapBytes(node);
    }
    JobTrack& job = it->second;
    if (event.world_size() > job.world_size_charged) {
      // A rescaled job: the engine's rank slots grow with it. Kept when the step is refused.
      const int64_t cost = costs_.rank_slot * (event.world_size() - job.world_size_charged);
      if (!Charge(cost, "rank")) return a;
      job.world_size_charged = event.world_size();
      job.charged_bytes += cost;
    }
    // A rank the engine does not know yet, beyond the most it knew at once, costs one more.
    if (!holder.has_value() && held->present_ranks >= job.ranks_charged) {
      if (!Charge(job.rank_bytes, "rank")) return a;
      job.charged_bytes += job.rank_bytes;
      ++job.ranks_charged;
      a.bytes = job.rank_bytes;
      a.ranks = 1;
    }
  }
  JobTrack& job = it->second;
  if (job.first_step < 0 || event.step() < job.first_step) job.first_step = event.step();
  if (job.first_seen_unix_nanos == 0) job.first_seen_unix_nanos = now;
  job.last_seen_unix_nanos = now;
  a.admitted = true;
  return a;
}

void CollectorState::Refund(const std::string& job, const Admission& a) {
  if (a.new_job) {
    EraseJob(job);
    return;
  }
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  accounted_bytes_ -= a.bytes;
  it->second.charged_bytes -= a.bytes;
  it->second.ranks_charged -= a.ranks;
}

void CollectorState::RefundForgottenRanks() {
  for (auto& [name, job] : jobs_) {
    const int known = engine_.KnownRanks(name).value_or(0);
    if (job.ranks_charged <= known) continue;
    const int64_t refund = job.rank_bytes * (job.ranks_charged - known);
    accounted_bytes_ -= refund;
    job.charged_bytes -= refund;
    job.ranks_charged = known;
  }
}

int64_t CollectorState::TrustedTime(int64_t sender, int64_t now, const std::string& node) {
  if (sender == 0) return now;
  // In unsigned arithmetic: a hostile stamp such as INT64_MIN would overflow a signed difference.
  const uint64_t skew = sender > now ? static_cast<uint64_t>(sender) - static_cast<uint64_t>(now)
                                     : static_cast<uint64_t>(now) - static_cast<uint64_t>(sender);
  if (skew <= static_cast<uint64_t>(std::max<int64_t>(0, options_.max_clock_skew_nanos))) {
    return sender;
  }
  ++counters_.clock_skew_corrected;
  uint64_t suppressed = 0;
  if (skew_log_limiter_.Allow(&suppressed)) {
    SW_LOG_WARNING << "node " << node << " sent a timestamp " << (sender > now ? "+" : "-")
                   << skew / 1'000'000'000 << " s off the collector's clock; using the "
                   << "collector's time (check NTP on that node)"
                   << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                      : std::string());
  }
  return now;
}

CollectorState::NodeTrack* CollectorState::TouchNode(const v1::ReportBatch& batch, int64_t now) {
  const std::string& name = batch.node().node().empty() ? batch.agent_id() : batch.node().node();
  // The node's description (host name, versions, NVML error) is kept only when all of it is
  // within bounds; the rest of the batch applies either way.
  std::optional<FieldProblem> info_problem;
  if (batch.has_node()) info_problem = CheckNodeInfo(batch.node());
  if (info_problem.has_value()) CountFieldRefused(*info_problem, name, "node description");
  const bool take_info = batch.has_node() && !info_problem.has_value();
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    if (static_cast<int>(nodes_.size()) >= options_.max_nodes) {
      HitLimit("nodes");
      return nullptr;
    }
    NodeView view;
    view.node = name;
    view.agent_id = batch.agent_id();
    if (take_info) view.info = batch.node();
    const int64_t text = NodeTextBytes(view);
    if (!Charge(costs_.node + text, "node")) return nullptr;
    it = nodes_.emplace(name, NodeTrack{}).first;
    it->second.view = std::move(view);
    it->second.text_bytes = text;
    SW_LOG_INFO << "new node " << name << " (agent " << batch.agent_id() << ", NVML "
                << (batch.node().nvml_available() ? "available" : "unavailable") << ")";
  } else {
    NodeTrack& n = it->second;
    if (n.view.agent_id != batch.agent_id()) {
      if (!n.view.agent_id.empty()) {
        // Two agents claiming one node name would interleave their series; say so once per
        // switch.
        SW_LOG_WARNING << "node " << name << " now reported by agent " << batch.agent_id()
                       << " (was " << n.view.agent_id << ")";
      }
      // Bounded like the node's name, and charged whatever the budget as the name is.
      const int64_t delta = StringHeapBytes(batch.agent_id()) - StringHeapBytes(n.view.agent_id);
      accounted_bytes_ += delta;
      n.text_bytes += delta;
      n.view.agent_id = batch.agent_id();
    }
    if (take_info) {
      // A longer description is charged; beyond the budget the previous one stays.
      const int64_t delta = KeptBytes(batch.node()) - KeptBytes(n.view.info);
      if (delta <= 0 || Charge(delta, "node description")) {
        if (delta < 0) accounted_bytes_ += delta;
        n.text_bytes += delta;
        n.view.info = batch.node();
      }
    }
  }
  NodeTrack& n = it->second;
  n.view.last_seen_unix_nanos = now;
  return &n;
}

absl::StatusOr<v1::IngestAck> CollectorState::Apply(const v1::ReportBatch& batch) {
  if (batch.agent_id().empty() || batch.boot_id().empty() || batch.seq() == 0) {
    CountMalformed("missing_field");
    return absl::InvalidArgumentError("ReportBatch needs agent_id, boot_id and seq >= 1");
  }
  // Node names and agent ids become label values and are printed by stepwatchctl; boot ids are
  // kept per stream for deduplication and journaled. Out of bounds, none says who sent the batch.
  if (const std::optional<FieldProblem> bad = CheckBatchIdentifiers(batch); bad.has_value()) {
    CountMalformed("bad_field", &*bad);
    return absl::InvalidArgumentError(BadIdentifierMessage(*bad));
  }
  const int64_t now = clock_->NowUnixNanos();
  absl::ReleasableMutexLock lock(&mu_);
  ++counters_.batches_received;
  const BatchDeduper::Result dedupe =
      deduper_.Observe(batch.agent_id(), batch.boot_id(), batch.seq(), batch.base_seq());
  v1::IngestAck ack;
  ack.set_boot_id(batch.boot_id());
  ack.set_acked_seq(dedupe.acked_seq);
  if (dedupe.duplicate) {
    ++counters_.duplicate_batches;
    SyncCounters();
    return ack;
  }

  NodeTrack* node = TouchNode(batch, now);
  const std::string& node_name =
      batch.node().node().empty() ? batch.agent_id() : batch.node().node();

  for (const v1::StepEvent& event : batch.steps()) {
    ++counters_.steps_received;
    // Validated before admission (a batch need not come from a real agent), so that invalid
    // steps cannot take job or rank slots.
    FillStepSample(event, node_name, now, &scratch_step_);
    // The job rule (1-256 bytes of UTF-8 without control characters) is part of the step rules.
    if (!analysis::ValidateStepEvent(scratch_step_).ok()) {
      ++counters_.steps_rejected["invalid"];
      continue;
    }
    const Admission admission = AdmitStep(event, node_name, now);
    if (!admission.admitted) {
      ++counters_.steps_rejected[admission.rejected];
      continue;
    }
    scratch_step_.received_unix_nanos =
        TrustedTime(scratch_step_.received_unix_nanos, now, node_name);
    absl::Status st = engine_.AddValidatedStep(scratch_step_);
    if (!st.ok()) {
      // Admission charged for what the engine did not take.
      Refund(event.job(), admission);
      ++counters_.steps_rejected[absl::IsResourceExhausted(st) ? "limit" : "invalid"];
    } else if (admission.takeover &&
               engine_.RankReportedFrom(event.job(), event.rank(), node_name)) {
      ++counters_.rank_takeovers;
      uint64_t suppressed = 0;
      if (takeover_log_limiter_.Allow(&suppressed)) {
        SW_LOG_INFO << "job " << event.job() << " rank " << event.rank() << " moved to node "
                    << node_name << " (its previous node went silent or its process exited)"
                    << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                       : std::string());
      }
    }
  }

  counters_.gpu_samples_received += batch.gpus_size();
  if (node != nullptr) {
    for (const v1::GpuSample& gpu : batch.gpus()) {
      if (const std::optional<FieldProblem> bad = CheckGpuSample(gpu); bad.has_value()) {
        CountFieldRefused(*bad, node_name, "GPU sample");
        continue;
      }
      auto slot = node->gpu_slot.find(gpu.index());
      if (slot == node->gpu_slot.end()) {
        if (static_cast<int>(node->gpu_slot.size()) >= options_.max_gpus_per_node) {
          HitLimit("gpus_per_node");
          continue;
        }
        if (!Charge(GpuBytes(gpu, node_name), "GPU")) continue;
        // Keep the GPUs ordered by index: insert and renumber the slots.
        auto pos =
            std::lower_bound(node->view.gpus.begin(), node->view.gpus.end(), gpu.index(),
                             [](const v1::GpuSample& g, int index) { return g.index() < index; });
        node->view.gpus.insert(pos, gpu);
        node->gpu_slot.clear();
        for (size_t i = 0; i < node->view.gpus.size(); ++i) {
          node->gpu_slot[node->view.gpus[i].index()] = i;
        }
      } else {
        // Longer strings or more pids than the last sample's are charged; beyond the budget the
        // sample is dropped.
        const int64_t delta = KeptBytes(gpu) - KeptBytes(node->view.gpus[slot->second]);
        if (delta > 0 && !Charge(delta, "GPU")) continue;
        if (delta < 0) accounted_bytes_ += delta;
        node->view.gpus[slot->second] = gpu;
      }
      analysis::GpuSample reading = ToGpuReading(gpu, node_name);
      reading.sampled_unix_nanos = TrustedTime(reading.sampled_unix_nanos, now, node_name);
      engine_.AddGpu(reading);
    }
    if (batch.has_host()) {
      ++counters_.host_samples_received;
      const int64_t delta =
          KeptBytes(batch.host()) - (node->view.host.has_value() ? KeptBytes(*node->view.host) : 0);
      if (const std::optional<FieldProblem> bad = CheckHostSample(batch.host()); bad.has_value()) {
        CountFieldRefused(*bad, node_name, "host sample");
      } else if (delta <= 0 || Charge(delta, "host sample")) {
        if (delta < 0) accounted_bytes_ += delta;
        node->text_bytes += delta;
        node->view.host = batch.host();
        analysis::HostSample reading = ToHostReading(batch.host(), node_name);
        reading.sampled_unix_nanos = TrustedTime(reading.sampled_unix_nanos, now, node_name);
        engine_.AddHost(reading);
      }
    }
  } else if (batch.has_host()) {
    ++counters_.host_samples_received;
  }

  // After the steps: the agent reports an exit after every step the process sent.
  for (const v1::RankExit& exit : batch.rank_exits()) {
    ++counters_.rank_exits_received;
    // Agents report exits only of processes they saw send (pid > 0), and only for ranks their
    // own node reported: anything else would let one node end another's job, stall and all.
    if (exit.pid() <= 0 || !engine_.RankReportedFrom(exit.job(), exit.rank(), node_name)) {
      CountNodeRefusal(node_name, "rank_exit_foreign");
      continue;
    }
    std::optional<analysis::FinishedJob> done =
        engine_.MarkRankExited(exit.job(), exit.rank(), exit.pid(),
                               TrustedTime(ExitedUnixNanos(exit, now), now, node_name));
    if (!done.has_value()) continue;
    FinishReport(done->last_snapshot, done->last_findings, "exited", now);
    SW_LOG_INFO << "job " << done->job << " finished: all " << done->ranks
                << " ranks exited (last step " << done->last_step << ")";
    EraseJob(done->job);
    ++counters_.jobs_finished;
  }
  // Jobs this node's agent moved to other collectors: its ranks of them are no longer expected
  // here. Once every rank has gone the job is forgotten, without a report (the collectors it
  // moved to hold it whole), instead of lingering with stale findings and a false stall until
  // --expire.
  for (const std::string& job : batch.released_jobs()) {
    std::optional<analysis::FinishedJob> done = engine_.ReleaseRanksOn(job, node_name, now);
    if (!done.has_value()) continue;
    SW_LOG_INFO << "job " << job << " moved to other collectors (every rank released by its "
                << "agents, last step " << done->last_step << "): forgetting it";
    reports_.Forget(job);
    EraseJob(job);
    ++counters_.jobs_moved_away;
  }
  // Applied: journaled (with --state-dir) before the acknowledgement, so that a collector killed
  // from here on does not count this batch again when the agent resends it.
  BatchDeduper::Sync sync;
  if (absl::Status st =
          deduper_.Commit(batch.agent_id(), batch.boot_id(), batch.seq(), batch.base_seq(), &sync);
      !st.ok()) {
    ++counters_.state_save_errors;
    const uint64_t n = deduper_.journal_errors();
    if ((n & (n - 1)) == 0) SW_LOG_WARNING << "batch deduplication journal (" << n << "): " << st;
  }
  SyncCounters();
  lock.Release();
  // Outside mu_: the disk does not hold up other streams, and concurrent batches share one sync.
  if (absl::Status st = sync.Wait(); !st.ok()) {
    absl::MutexLock relock(&mu_);
    ++counters_.state_save_errors;
    SyncCounters();
    SW_LOG_WARNING << "batch deduplication journal: " << st;
  }
  return ack;
}

void CollectorState::Tick() {
  const int64_t now = clock_->NowUnixNanos();
  AdvanceExpireAndPublish(now);
  reports_.Prune(now);
  // Outside mu_: disk latency must not hold up ingest.
  const int failures = reports_.Flush(now);
  // Reports the disk did not take stay in memory: they count against the budget meanwhile.
  const int64_t unsaved = reports_.unsaved_bytes();
  absl::MutexLock lock(&mu_);
  counters_.state_save_errors += failures;
  accounted_bytes_ += unsaved - reports_charged_bytes_;
  reports_charged_bytes_ = unsaved;
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
    reports_.Observe(job, found == by_job.end() ? none : found->second, SpanOf(job.job), now);
  }
}

void CollectorState::FinishReport(const analysis::JobSnapshot& job,
                                  const std::vector<analysis::Finding>& findings,
                                  const char* reason, int64_t now) {
  reports_.Finish(job, findings, SpanOf(job.job), reason, now);
}

JobSpan CollectorState::SpanOf(const std::string& job) const {
  auto track = jobs_.find(job);
  if (track == jobs_.end()) return JobSpan{};
  return JobSpan{track->second.first_step, track->second.first_seen_unix_nanos};
}

void CollectorState::AdvanceExpireAndPublish(int64_t now) {
  absl::MutexLock tick_lock(&tick_mu_);
  const int64_t cutoff = now - options_.expire_nanos;
  auto view = std::make_shared<PublishedView>();
  StateSnapshot& s = view->snapshot;
  const auto locked_at = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    engine_.Advance(now);
    // One evaluation per tick serves the reports, the expired jobs' reports and the view.
    std::vector<analysis::JobSnapshot> jobs = engine_.Jobs();
    std::vector<analysis::Finding> findings = engine_.Findings();
    ObserveReports(jobs, findings, now);
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
    bool nodes_removed = false;
    for (auto it = nodes_.begin(); it != nodes_.end();) {
      if (it->second.view.last_seen_unix_nanos < cutoff) {
        SW_LOG_INFO << "node " << it->first << " unseen for "
                    << options_.expire_nanos / 1'000'000'000 << " s: forgetting it";
        engine_.RemoveNode(it->first);
        deduper_.ForgetAgent(it->second.view.agent_id);
        ++counters_.expired["node"];
        int64_t charged = costs_.node + it->second.text_bytes;
        for (const v1::GpuSample& g : it->second.view.gpus) charged += GpuBytes(g, it->first);
        accounted_bytes_ -= charged;
        it = nodes_.erase(it);
        nodes_removed = true;
      } else {
        ++it;
      }
    }
    // The engine forgot the ranks of removed nodes: so do the charges.
    if (nodes_removed) RefundForgottenRanks();

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
    view->build_locked_nanos = NanosSince(build_at);
  }
  view->tick_locked_nanos = NanosSince(locked_at);
  view->longest_hold_nanos = view->tick_locked_nanos;
  s.now_unix_nanos = now;
  s.node_down_nanos = options_.node_down_nanos;
  s.memory_budget_bytes = options_.max_memory_bytes;
  s.nodes_tracked = s.nodes.size();
  for (const analysis::Finding& f : s.findings) ++view->findings_per_job[f.job];
  // Outside the ingest mutex: sorted once per tick so that no scrape scans every node.
  view->nodes_by_last_seen.resize(s.nodes.size());
  for (size_t i = 0; i < s.nodes.size(); ++i) view->nodes_by_last_seen[i] = i;
  std::sort(view->nodes_by_last_seen.begin(), view->nodes_by_last_seen.end(),
            [&nodes = s.nodes](uint32_t a, uint32_t b) {
              return nodes[a].last_seen_unix_nanos < nodes[b].last_seen_unix_nanos;
            });
  PublishRankRows(view.get());
  Publish(std::move(view));
}

void CollectorState::PublishRankRows(PublishedView* view) {
  const auto start = std::chrono::steady_clock::now();
  const bool rebuild =
      rank_rows_cost_nanos_ < kRankRowsAlwaysRebuildNanos ||
      NanosSince(rank_rows_built_at_) >= kRankRowsCostMultiple * rank_rows_cost_nanos_;
  const std::shared_ptr<const PublishedView> previous = Published();
  bool built_any = false;
  view->ranks.reserve(view->snapshot.jobs.size());
  for (const analysis::JobSnapshot& j : view->snapshot.jobs) {
    if (!rebuild) {
      if (auto it = previous->ranks.find(j.job); it != previous->ranks.end()) {
        view->ranks.emplace(j.job, it->second);
        continue;
      }
    }
    // Rows are what a tick costs most at scale: 100,000 ranks take longer than ingest may wait.
    // They are built in slices, each under the mutex on its own, so ingest waits at most one
    // slice; rows of one job may then be a few slices apart.
    auto rows = std::make_shared<std::vector<analysis::RankSnapshot>>();
    for (int first = 0; first < j.world_size; first += kRankRowsPerHold) {
      const auto slice_at = std::chrono::steady_clock::now();
      std::vector<analysis::RankSnapshot> slice;
      {
        absl::MutexLock lock(&mu_);
        slice = engine_.Ranks(j.job, first, first + kRankRowsPerHold);
      }
      const int64_t held = NanosSince(slice_at);
      view->rank_rows_locked_nanos += held;
      view->longest_hold_nanos = std::max(view->longest_hold_nanos, held);
      rows->insert(rows->end(), std::make_move_iterator(slice.begin()),
                   std::make_move_iterator(slice.end()));
    }
    view->ranks.emplace(j.job, std::move(rows));
    built_any = true;
  }
  const auto unlocked_at = std::chrono::steady_clock::now();
  if (built_any || view->ranks.size() != previous->ranks.size()) {
    SelectRankSeries(view);
  } else {
    view->snapshot.top_ranks = previous->snapshot.top_ranks;
    view->rank_series_dropped = previous->rank_series_dropped;
  }
  view->build_unlocked_nanos = NanosSince(unlocked_at);
  view->rank_rows_rebuilt = rebuild;
  if (rebuild) {
    rank_rows_built_at_ = start;
    rank_rows_cost_nanos_ = NanosSince(start);
  }
}

void CollectorState::RunWithIngestLockHeld(const std::function<void()>& fn) {
  absl::MutexLock lock(&mu_);
  fn();
}

v1::StatusResponse CollectorState::Status() const {
  v1::StatusResponse out;
  const std::shared_ptr<const PublishedView> view = Published();
  for (const analysis::JobSnapshot& job : view->snapshot.jobs) {
    auto it = view->findings_per_job.find(job.job);
    ToProto(job, it == view->findings_per_job.end() ? 0 : it->second, out.add_jobs());
  }
  // Jobs first; nodes while the answer stays under max_answer_bytes, so that it always fits the
  // gRPC send limit (the last nodes are left out, and logged, beyond it).
  size_t bytes = out.ByteSizeLong();
  size_t omitted = 0;
  for (const NodeView& n : view->snapshot.nodes) {
    if (bytes > static_cast<size_t>(std::max<int64_t>(0, options_.max_answer_bytes))) {
      ++omitted;
      continue;
    }
    v1::NodeStatus* ns = out.add_nodes();
    ns->set_node(n.node);
    ns->set_agent_id(n.agent_id);
    ns->set_last_seen_unix_nanos(n.last_seen_unix_nanos);
    ns->set_nvml_available(n.info.nvml_available());
    ns->set_nvml_error(n.info.nvml_error());
    if (n.host.has_value() && n.host->has_cpu_utilization_ratio()) {
      ns->set_cpu_utilization_ratio(n.host->cpu_utilization_ratio());
    }
    for (const v1::GpuSample& g : n.gpus) {
      v1::GpuStatus* gs = ns->add_gpus();
      gs->set_index(g.index());
      gs->set_name(g.name());
      if (g.has_utilization_gpu_ratio()) gs->set_utilization_gpu_ratio(g.utilization_gpu_ratio());
      if (g.has_sm_activity_ratio()) gs->set_sm_activity_ratio(g.sm_activity_ratio());
      if (g.has_memory_used_bytes()) gs->set_memory_used_bytes(g.memory_used_bytes());
      if (g.has_memory_total_bytes()) gs->set_memory_total_bytes(g.memory_total_bytes());
      *gs->mutable_pids() = g.pids();
    }
    bytes += ns->ByteSizeLong() + 8;  // and its tag and length
  }
  if (omitted > 0) {
    SW_LOG_WARNING << "status answer over " << (options_.max_answer_bytes >> 20)
                   << " MiB: " << omitted << " of " << view->snapshot.nodes.size()
                   << " nodes left out";
  }
  return out;
}

v1::FindingsResponse CollectorState::Findings(absl::string_view job) const {
  v1::FindingsResponse out;
  const std::shared_ptr<const PublishedView> view = Published();
  // Ordered by job, kind, rank: beyond max_answer_bytes the rest are left out (and logged).
  size_t bytes = 0;
  size_t omitted = 0;
  for (const analysis::Finding& f : view->snapshot.findings) {
    if (!job.empty() && f.job != job) continue;
    if (bytes > static_cast<size_t>(std::max<int64_t>(0, options_.max_answer_bytes))) {
      ++omitted;
      continue;
    }
    v1::Finding* out_f = out.add_findings();
    ToProto(f, out_f);
    bytes += out_f->ByteSizeLong() + 8;
  }
  if (omitted > 0) {
    SW_LOG_WARNING << "findings answer over " << (options_.max_answer_bytes >> 20)
                   << " MiB: " << omitted << " findings left out";
  }
  return out;
}

absl::StatusOr<v1::ExplainResponse> CollectorState::Explain(absl::string_view job) const {
  v1::ExplainResponse out;
  const std::shared_ptr<const PublishedView> view = Published();
  const std::vector<analysis::JobSnapshot>& jobs = view->snapshot.jobs;
  // Jobs are ordered by name (the engine's registry is).
  auto snap = std::lower_bound(
      jobs.begin(), jobs.end(), job,
      [](const analysis::JobSnapshot& j, absl::string_view name) { return j.job < name; });
  if (snap == jobs.end() || snap->job != job) {
    return absl::NotFoundError(absl::StrCat("no job named \"", job, "\""));
  }
  int count = 0;
  for (const analysis::Finding& f : view->snapshot.findings) {
    if (f.job != job) continue;
    ++count;
    ToProto(f, out.add_findings());
  }
  ToProto(*snap, count, out.mutable_job());
  // Unknown (no rank reported how its step splits) stays unknown: empty maps, not 100% compute.
  if (snap->split_known) {
    auto& tr = *out.mutable_time_ratio();
    tr["compute"] = snap->breakdown.compute;
    tr["imbalance"] = snap->breakdown.imbalance;
    tr["comm"] = snap->breakdown.comm;
    tr["data"] = snap->breakdown.data;
    tr["other"] = snap->breakdown.other;
    WhatIfToProto(snap->whatif, out.mutable_whatif_speedup_ratio(), out.mutable_whatif_kind());
  }
  if (snap->scaling_efficiency_ratio.has_value()) {
    out.set_scaling_efficiency_ratio(*snap->scaling_efficiency_ratio);
  }
  if (auto ranks = view->ranks.find(job); ranks != view->ranks.end()) {
    for (const analysis::RankSnapshot& r : *ranks->second) ToProto(r, out.add_ranks());
  }
  return out;
}

StateSnapshot CollectorState::Snapshot(NodeScope scope) const {
  const std::shared_ptr<const PublishedView> view = Published();
  const StateSnapshot& published = view->snapshot;
  const int64_t now = clock_->NowUnixNanos();
  StateSnapshot s;
  if (scope == NodeScope::kAll) {
    s = published;
  } else {
    // Everything but the nodes (bounded by the jobs, findings and rank-series limits), then the
    // nodes involved: the copy costs what the scrape exports, not the fleet.
    s.node_down_nanos = published.node_down_nanos;
    s.jobs = published.jobs;
    s.findings = published.findings;
    s.top_ranks = published.top_ranks;
    s.nodes_tracked = published.nodes_tracked;
    s.memory_budget_bytes = published.memory_budget_bytes;
    s.detector_timings = published.detector_timings;
    std::vector<uint32_t> picked;
    const std::vector<NodeView>& nodes = published.nodes;
    for (const auto& [name, involved] : InvolvedNodes(published.findings)) {
      auto it =
          std::lower_bound(nodes.begin(), nodes.end(), name,
                           [](const NodeView& n, const std::string& key) { return n.node < key; });
      if (it != nodes.end() && it->node == name) picked.push_back(it - nodes.begin());
    }
    for (uint32_t i : view->nodes_by_last_seen) {
      if (now - nodes[i].last_seen_unix_nanos <= published.node_down_nanos) break;
      picked.push_back(i);
    }
    std::sort(picked.begin(), picked.end());
    picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
    s.nodes.reserve(picked.size());
    for (uint32_t i : picked) s.nodes.push_back(nodes[i]);
  }
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

void CollectorState::SelectRankSeries(PublishedView* view) const {
  const auto slower = [](const analysis::RankSnapshot* a, const analysis::RankSnapshot* b) {
    if (a->busy_vs_median_ratio != b->busy_vs_median_ratio) {
      return a->busy_vs_median_ratio > b->busy_vs_median_ratio;
    }
    return a->rank < b->rank;
  };
  const std::vector<analysis::JobSnapshot>& jobs = view->snapshot.jobs;
  auto* out = &view->snapshot.top_ranks;
  const size_t cap = static_cast<size_t>(std::max(0, options_.max_rank_series));
  const size_t top_k = static_cast<size_t>(std::max(0, options_.top_ranks_per_job));
  // Flagged ranks of every job come first, so that the cap never hides a verdict behind a merely
  // slow rank; then each job's slowest unflagged ranks.
  std::vector<std::vector<const analysis::RankSnapshot*>> rest(jobs.size());
  uint64_t dropped = 0;
  std::vector<const analysis::RankSnapshot*> ranks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    auto found = view->ranks.find(jobs[j].job);
    if (found == view->ranks.end()) continue;
    ranks.clear();
    for (const analysis::RankSnapshot& r : *found->second) ranks.push_back(&r);
    std::sort(ranks.begin(), ranks.end(), slower);
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i]->straggler) {
        if (out->size() < cap) {
          out->emplace_back(jobs[j].job, *ranks[i]);
        } else {
          ++dropped;
        }
      } else if (i < top_k) {
        rest[j].push_back(ranks[i]);
      }
    }
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (const analysis::RankSnapshot* r : rest[j]) {
      if (out->size() < cap) {
        out->emplace_back(jobs[j].job, *r);
      } else {
        ++dropped;
      }
    }
  }
  view->rank_series_dropped = dropped;
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
