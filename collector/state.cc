#include "collector/state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collector/convert.h"
#include "common/log.h"
#include "common/text.h"

namespace stepwatch::collector {
namespace {

// Label values (job, node) are bounded: longer ones are refused, not truncated, so that two
// distinct names cannot collide. Names also reach terminals: no control characters.
constexpr size_t kMaxNameBytes = 256;

bool ValidName(absl::string_view name) {
  return name.size() <= kMaxNameBytes && FindControlCharacter(name) == absl::string_view::npos;
}

analysis::EngineOptions EngineOptionsWithLimits(const CollectorStateOptions& o) {
  analysis::EngineOptions e = o.engine;
  // The collector checks these limits itself first (to count them by name); the engine's own
  // check is a backstop.
  e.max_jobs = o.max_jobs;
  e.max_ranks_per_job = o.max_ranks_per_job;
  return e;
}

}  // namespace

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
      engine_(EngineOptionsWithLimits(options_)),
      deduper_(options_.dedupe),
      costs_(MemoryCostsFor(options_.engine)),
      reports_(options_.reports) {
  // Never fatal: without its directory the collector still keeps reports in memory.
  if (absl::Status st = reports_.Load(clock_->NowUnixNanos()); !st.ok()) {
    SW_LOG_WARNING << "job reports will not survive a restart: " << st;
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status st = deduper_.OpenJournal(); !st.ok()) {
    SW_LOG_WARNING << "batch deduplication journal: " << st;
  }
}

void CollectorState::CountRefused(const char* reason) {
  absl::MutexLock lock(&mu_);
  ++counters_.refused[reason];
}

void CollectorState::CountIngestError() {
  absl::MutexLock lock(&mu_);
  ++counters_.ingest_errors;
}

void CollectorState::CountStateSaveError() {
  absl::MutexLock lock(&mu_);
  ++counters_.state_save_errors;
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
  jobs_.erase(it);
}

bool CollectorState::AdmitStep(const v1::StepEvent& event, int64_t now) {
  if (event.world_size() > options_.max_ranks_per_job) {
    ++counters_.limit_hits["ranks_per_job"];
    return false;
  }
  auto it = jobs_.find(event.job());
  if (it == jobs_.end()) {
    if (static_cast<int>(jobs_.size()) >= options_.max_jobs) {
      ++counters_.limit_hits["jobs"];
      return false;
    }
    const int64_t cost = costs_.job + costs_.rank_slot * event.world_size() + costs_.rank;
    if (!Charge(cost, "job")) return false;
    it = jobs_.emplace(event.job(), JobTrack{}).first;
    it->second.world_size_charged = event.world_size();
    it->second.charged_bytes = cost;
    it->second.ranks.insert(event.rank());
  }
  JobTrack& job = it->second;
  if (event.world_size() > job.world_size_charged) {
    // A rescaled job: the engine's rank slots grow with it.
    const int64_t cost = costs_.rank_slot * (event.world_size() - job.world_size_charged);
    if (!Charge(cost, "rank")) return false;
    job.world_size_charged = event.world_size();
    job.charged_bytes += cost;
  }
  if (!job.ranks.contains(event.rank())) {
    if (static_cast<int>(job.ranks.size()) >= options_.max_ranks_per_job) {
      ++counters_.limit_hits["ranks_per_job"];
      return false;
    }
    if (!Charge(costs_.rank, "rank")) return false;
    job.charged_bytes += costs_.rank;
    job.ranks.insert(event.rank());
  }
  if (job.first_step < 0 || event.step() < job.first_step) job.first_step = event.step();
  if (job.first_seen_unix_nanos == 0) job.first_seen_unix_nanos = now;
  job.last_seen_unix_nanos = now;
  return true;
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
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    if (static_cast<int>(nodes_.size()) >= options_.max_nodes) {
      ++counters_.limit_hits["nodes"];
      return nullptr;
    }
    if (!Charge(costs_.node, "node")) return nullptr;
    it = nodes_.emplace(name, NodeTrack{}).first;
    it->second.view.node = name;
    SW_LOG_INFO << "new node " << name << " (agent " << batch.agent_id() << ", NVML "
                << (batch.node().nvml_available() ? "available" : "unavailable") << ")";
  }
  NodeTrack& n = it->second;
  if (n.view.agent_id != batch.agent_id()) {
    if (!n.view.agent_id.empty()) {
      // Two agents claiming one node name would interleave their series; say so once per switch.
      SW_LOG_WARNING << "node " << name << " now reported by agent " << batch.agent_id() << " (was "
                     << n.view.agent_id << ")";
    }
    n.view.agent_id = batch.agent_id();
  }
  if (batch.has_node()) n.view.info = batch.node();
  n.view.last_seen_unix_nanos = now;
  return &n;
}

absl::StatusOr<v1::IngestAck> CollectorState::Apply(const v1::ReportBatch& batch) {
  if (batch.agent_id().empty() || batch.boot_id().empty() || batch.seq() == 0) {
    CountIngestError();
    return absl::InvalidArgumentError("ReportBatch needs agent_id, boot_id and seq >= 1");
  }
  // Node names and agent ids become label values and are printed by stepwatchctl.
  for (const std::string* name : {&batch.node().node(), &batch.agent_id()}) {
    if (!ValidName(*name)) {
      CountIngestError();
      return absl::InvalidArgumentError(absl::StrCat("node name or agent id longer than ",
                                                     kMaxNameBytes,
                                                     " bytes or with control characters"));
    }
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
    if (!ValidName(event.job()) || !analysis::ValidateStepSample(scratch_step_).ok()) {
      ++counters_.steps_rejected["invalid"];
      continue;
    }
    if (!AdmitStep(event, now)) {
      ++counters_.steps_rejected["limit"];
      continue;
    }
    scratch_step_.received_unix_nanos =
        TrustedTime(scratch_step_.received_unix_nanos, now, node_name);
    absl::Status st = engine_.AddStep(scratch_step_);
    if (!st.ok()) {
      ++counters_.steps_rejected[absl::IsResourceExhausted(st) ? "limit" : "invalid"];
    }
  }

  counters_.gpu_samples_received += batch.gpus_size();
  if (node != nullptr) {
    for (const v1::GpuSample& gpu : batch.gpus()) {
      auto slot = node->gpu_slot.find(gpu.index());
      if (slot == node->gpu_slot.end()) {
        if (static_cast<int>(node->gpu_slot.size()) >= options_.max_gpus_per_node) {
          ++counters_.limit_hits["gpus_per_node"];
          continue;
        }
        if (!Charge(costs_.gpu, "GPU")) continue;
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
        node->view.gpus[slot->second] = gpu;
      }
      analysis::GpuReading reading = ToGpuReading(gpu, node_name);
      reading.sampled_unix_nanos = TrustedTime(reading.sampled_unix_nanos, now, node_name);
      engine_.AddGpu(reading);
    }
    if (batch.has_host()) {
      ++counters_.host_samples_received;
      node->view.host = batch.host();
      analysis::HostReading reading = ToHostReading(batch.host(), node_name);
      reading.sampled_unix_nanos = TrustedTime(reading.sampled_unix_nanos, now, node_name);
      engine_.AddHost(reading);
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
      ++counters_.refused["rank_exit_foreign"];
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
  lock.Release();
  // Outside mu_: the disk does not hold up other streams, and concurrent batches share one sync.
  if (absl::Status st = sync.Wait(); !st.ok()) {
    absl::MutexLock relock(&mu_);
    ++counters_.state_save_errors;
    SW_LOG_WARNING << "batch deduplication journal: " << st;
  }
  return ack;
}

void CollectorState::Tick() {
  const int64_t now = clock_->NowUnixNanos();
  AdvanceAndExpire(now);
  reports_.Prune(now);
  // Outside mu_: disk latency must not hold up ingest.
  if (int failures = reports_.Flush(); failures > 0) {
    absl::MutexLock lock(&mu_);
    counters_.state_save_errors += failures;
  }
}

void CollectorState::ObserveReports(int64_t now) {
  absl::flat_hash_map<std::string, std::vector<analysis::Finding>> by_job;
  for (analysis::Finding& f : engine_.Findings()) {
    if (!f.job.empty()) by_job[f.job].push_back(std::move(f));
  }
  const std::vector<analysis::Finding> none;
  for (const analysis::JobSnapshot& job : engine_.Jobs()) {
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

void CollectorState::AdvanceAndExpire(int64_t now) {
  const int64_t cutoff = now - options_.expire_nanos;
  absl::MutexLock lock(&mu_);
  engine_.Advance(now);
  ObserveReports(now);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second.last_seen_unix_nanos < cutoff) {
      SW_LOG_INFO << "job " << it->first << " unseen for " << options_.expire_nanos / 1'000'000'000
                  << " s: forgetting it";
      if (std::optional<analysis::JobSnapshot> snap = engine_.Job(it->first); snap.has_value()) {
        std::vector<analysis::Finding> findings = engine_.Findings();
        findings.erase(
            std::remove_if(findings.begin(), findings.end(),
                           [&](const analysis::Finding& f) { return f.job != snap->job; }),
            findings.end());
        FinishReport(*snap, findings, "expired", now);
      }
      engine_.RemoveJob(it->first);
      ++counters_.expired["job"];
      accounted_bytes_ -= it->second.charged_bytes;
      jobs_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (it->second.view.last_seen_unix_nanos < cutoff) {
      SW_LOG_INFO << "node " << it->first << " unseen for " << options_.expire_nanos / 1'000'000'000
                  << " s: forgetting it";
      engine_.RemoveNode(it->first);
      deduper_.ForgetAgent(it->second.view.agent_id);
      ++counters_.expired["node"];
      accounted_bytes_ -=
          costs_.node + costs_.gpu * static_cast<int64_t>(it->second.gpu_slot.size());
      it = nodes_.erase(it);
    } else {
      ++it;
    }
  }
}

v1::StatusResponse CollectorState::Status() const {
  v1::StatusResponse out;
  absl::MutexLock lock(&mu_);
  const std::vector<analysis::Finding> findings = engine_.Findings();
  absl::flat_hash_map<std::string, int> per_job;
  for (const auto& f : findings) ++per_job[f.job];
  for (const analysis::JobSnapshot& job : engine_.Jobs()) {
    auto it = per_job.find(job.job);
    ToProto(job, it == per_job.end() ? 0 : it->second, out.add_jobs());
  }
  // Jobs first; nodes while the answer stays under max_answer_bytes, so that it always fits the
  // gRPC send limit (the last nodes are left out, and logged, beyond it).
  size_t bytes = out.ByteSizeLong();
  size_t omitted = 0;
  for (const auto& [name, track] : nodes_) {
    if (bytes > static_cast<size_t>(std::max<int64_t>(0, options_.max_answer_bytes))) {
      ++omitted;
      continue;
    }
    const NodeView& n = track.view;
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
                   << " MiB: " << omitted << " of " << nodes_.size() << " nodes left out";
  }
  return out;
}

v1::FindingsResponse CollectorState::Findings(absl::string_view job) const {
  v1::FindingsResponse out;
  absl::MutexLock lock(&mu_);
  // Ordered by job, kind, rank: beyond max_answer_bytes the rest are left out (and logged).
  size_t bytes = 0;
  size_t omitted = 0;
  for (const analysis::Finding& f : engine_.Findings()) {
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
  absl::MutexLock lock(&mu_);
  std::optional<analysis::JobSnapshot> snap = engine_.Job(job);
  if (!snap.has_value()) return absl::NotFoundError(absl::StrCat("no job named \"", job, "\""));
  int count = 0;
  for (const analysis::Finding& f : engine_.Findings()) {
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
    auto& wi = *out.mutable_whatif_speedup_ratio();
    wi["stragglers"] = snap->whatif.stragglers;
    wi["overlap"] = snap->whatif.overlap;
    wi["data"] = snap->whatif.data;
  }
  if (snap->scaling_efficiency_ratio.has_value()) {
    out.set_scaling_efficiency_ratio(*snap->scaling_efficiency_ratio);
  }
  for (const analysis::RankSnapshot& r : engine_.Ranks(job)) ToProto(r, out.add_ranks());
  return out;
}

StateSnapshot CollectorState::Snapshot() const {
  StateSnapshot s;
  s.now_unix_nanos = clock_->NowUnixNanos();
  s.node_down_nanos = options_.node_down_nanos;
  s.agents_connected = agents_connected_.load();
  absl::MutexLock lock(&mu_);
  s.jobs = engine_.Jobs();
  s.findings = engine_.Findings();
  SelectRankSeries(s.jobs, &s.top_ranks);
  s.nodes.reserve(nodes_.size());
  for (const auto& [name, track] : nodes_) s.nodes.push_back(track.view);
  s.counters = counters_;
  s.counters.rank_series_dropped = rank_series_dropped_;
  s.memory_accounted_bytes = accounted_bytes_;
  s.memory_budget_bytes = options_.max_memory_bytes;
  s.detector_timings = engine_.DetectorTimings();
  return s;
}

void CollectorState::SelectRankSeries(
    const std::vector<analysis::JobSnapshot>& jobs,
    std::vector<std::pair<std::string, analysis::RankSnapshot>>* out) const {
  const auto slower = [](const analysis::RankSnapshot& a, const analysis::RankSnapshot& b) {
    if (a.busy_vs_median_ratio != b.busy_vs_median_ratio) {
      return a.busy_vs_median_ratio > b.busy_vs_median_ratio;
    }
    return a.rank < b.rank;
  };
  const size_t cap = static_cast<size_t>(std::max(0, options_.max_rank_series));
  const size_t top_k = static_cast<size_t>(std::max(0, options_.top_ranks_per_job));
  // Flagged ranks of every job come first, so that the cap never hides a verdict behind a merely
  // slow rank; then each job's slowest unflagged ranks.
  std::vector<std::vector<analysis::RankSnapshot>> rest(jobs.size());
  uint64_t dropped = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    std::vector<analysis::RankSnapshot> ranks = engine_.Ranks(jobs[j].job);
    std::sort(ranks.begin(), ranks.end(), slower);
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i].straggler) {
        if (out->size() < cap) {
          out->emplace_back(jobs[j].job, std::move(ranks[i]));
        } else {
          ++dropped;
        }
      } else if (i < top_k) {
        rest[j].push_back(std::move(ranks[i]));
      }
    }
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (analysis::RankSnapshot& r : rest[j]) {
      if (out->size() < cap) {
        out->emplace_back(jobs[j].job, std::move(r));
      } else {
        ++dropped;
      }
    }
  }
  rank_series_dropped_ += dropped;
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
