// Ingest: CollectorState::Apply, one batch as small steps (steps, GPU samples, the host sample,
// rank exits, released jobs), each under the ingest mutex Apply holds.
#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/dedupe.h"
#include "collector/memory_budget.h"
#include "collector/published_state.h"
#include "collector/report_store.h"
#include "collector/state.h"
#include "common/clock.h"
#include "common/log.h"

namespace stepwatch::collector {
namespace {

std::string BadIdentifierMessage(const FieldProblem& bad) {
  size_t bound = kMaxNodeNameBytes;
  if (std::string(bad.field) == "boot_id") bound = kMaxBootIdBytes;
  return std::string(bad.reason) == "too_long"
             ? absl::StrCat("ReportBatch ", bad.field, " longer than ", bound, " bytes")
             : absl::StrCat("ReportBatch ", bad.field, " with control characters");
}

}  // namespace

absl::StatusOr<v1::IngestAck> CollectorState::Apply(const v1::ReportBatch& batch) {
  BatchDeduper::Sync durable;
  absl::StatusOr<v1::IngestAck> ack = Apply(batch, &durable);
  if (ack.ok()) CountJournalSyncError(durable.Wait());
  return ack;
}

void CollectorState::CountJournalSyncError(const absl::Status& st) {
  if (st.ok()) return;
  absl::MutexLock lock(&mu_);
  ++counters_.state_save_errors;
  SyncCounters();
  // Every waiting batch of a failed sync lands here: logged at powers of two.
  const uint64_t n = ++journal_sync_errors_;
  if ((n & (n - 1)) == 0) {
    SW_LOG_WARNING << "batch deduplication journal (" << n << " unsynced batches): " << st;
  }
}

absl::StatusOr<v1::IngestAck> CollectorState::Apply(const v1::ReportBatch& batch,
                                                    BatchDeduper::Sync* durable) {
  *durable = BatchDeduper::Sync();
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
    deduper_.SyncAppended(durable);
    ++counters_.duplicate_batches;
    SyncCounters();
    return ack;
  }

  NodeTrack* node = TouchNode(batch, now);
  const std::string& node_name =
      batch.node().node().empty() ? batch.agent_id() : batch.node().node();

  for (const v1::StepEvent& event : batch.steps()) ApplyStep(event, node_name, now);
  ApplyGpuSamples(batch, node, node_name, now);
  ApplyHostSample(batch, node, node_name, now);
  // After the steps: the agent reports an exit after every step the process sent.
  ApplyRankExits(batch, node_name, now);
  ApplyReleasedJobs(batch, node_name, now);
  // Applied: journaled (with --state-dir) before the acknowledgement, so that a collector killed
  // from here on does not count this batch again when the agent resends it. The caller waits for
  // `durable` outside mu_: the disk does not hold up other streams, and concurrent batches share
  // one sync.
  if (absl::Status st = deduper_.Commit(batch.agent_id(), batch.boot_id(), batch.seq(),
                                        batch.base_seq(), durable);
      !st.ok()) {
    ++counters_.state_save_errors;
    const uint64_t n = deduper_.journal_errors();
    if ((n & (n - 1)) == 0) SW_LOG_WARNING << "batch deduplication journal (" << n << "): " << st;
  }
  SyncCounters();
  return ack;
}

void CollectorState::ApplyStep(const v1::StepEvent& event, const std::string& node_name,
                               int64_t now) {
  ++counters_.steps_received;
  // Validated before admission (a batch need not come from a real agent), so that invalid
  // steps cannot take job or rank slots.
  FillStepSample(event, node_name, now, &scratch_step_);
  // The job rule (1-256 bytes of UTF-8 without control characters) is part of the step rules.
  if (!analysis::ValidateStepEvent(scratch_step_).ok()) {
    ++counters_.steps_rejected["invalid"];
    return;
  }
  const Admission admission = AdmitStep(event, node_name, now);
  if (!admission.admitted) {
    ++counters_.steps_rejected[admission.rejected];
    return;
  }
  scratch_step_.received_unix_nanos =
      TrustedTime(scratch_step_.received_unix_nanos, now, node_name);
  absl::Status st = engine_.AddValidatedStep(scratch_step_);
  if (st.ok()) KeepRankPod(event, node_name);
  if (!st.ok()) {
    // Admission charged for what the engine did not take.
    Refund(event.job(), admission);
    ++counters_.steps_rejected[absl::IsResourceExhausted(st) ? "limit" : "invalid"];
  } else if (admission.takeover && engine_.RankReportedFrom(event.job(), event.rank(), node_name)) {
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

void CollectorState::ApplyGpuSamples(const v1::ReportBatch& batch, NodeTrack* node,
                                     const std::string& node_name, int64_t now) {
  counters_.gpu_samples_received += batch.gpus_size();
  if (node == nullptr) return;
  for (const v1::GpuSample& gpu : batch.gpus()) {
    if (const std::optional<FieldProblem> bad = CheckGpuSample(gpu); bad.has_value()) {
      CountFieldRefused(*bad, node_name, "GPU sample");
      continue;
    }
    if (!KeepGpuSample(gpu, node, node_name)) continue;
    analysis::GpuSample reading = ToGpuReading(gpu, node_name);
    reading.sampled_unix_nanos = TrustedTime(reading.sampled_unix_nanos, now, node_name);
    engine_.AddGpu(reading);
  }
}

bool CollectorState::KeepGpuSample(const v1::GpuSample& gpu, NodeTrack* node,
                                   const std::string& node_name) {
  auto slot = node->gpu_slot.find(gpu.index());
  if (slot == node->gpu_slot.end()) {
    if (static_cast<int>(node->gpu_slot.size()) >= options_.max_gpus_per_node) {
      HitLimit("gpus_per_node");
      return false;
    }
    if (!Charge(GpuBytes(costs_, gpu, node_name), "GPU")) return false;
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
    if (delta > 0 && !Charge(delta, "GPU")) return false;
    if (delta < 0) accounted_bytes_ += delta;
    node->view.gpus[slot->second] = gpu;
  }
  return true;
}

void CollectorState::ApplyHostSample(const v1::ReportBatch& batch, NodeTrack* node,
                                     const std::string& node_name, int64_t now) {
  if (!batch.has_host()) return;
  ++counters_.host_samples_received;
  if (node == nullptr) return;
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

void CollectorState::ApplyRankExits(const v1::ReportBatch& batch, const std::string& node_name,
                                    int64_t now) {
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
}

void CollectorState::ApplyReleasedJobs(const v1::ReportBatch& batch, const std::string& node_name,
                                       int64_t now) {
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
}

}  // namespace stepwatch::collector
