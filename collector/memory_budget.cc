#include "collector/memory_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "collector/convert.h"
#include "collector/pod_index.h"
#include "collector/state.h"
#include "common/log.h"

namespace stepwatch::collector {
namespace {

// Copies of a job's name the collector keeps beside its per-rank ones: the engine's registry key
// and record, the collector's track, the running report, the scaling history, its findings.
constexpr int64_t kJobNameCopies = 6;
// Copies of a node's name: the node map's key, its view and node info, the engine's node index,
// host record and the name of the job-per-node count.
constexpr int64_t kNodeNameCopies = 6;

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

int64_t NewJobBytes(const MemoryCosts& costs, const std::string& job, const std::string& node,
                    int world_size, int64_t rank_bytes) {
  return costs.job + kJobNameCopies * StringHeapBytes(job) + StringHeapBytes(node) +
         costs.rank_slot * world_size + rank_bytes;
}

int64_t RankBytes(const MemoryCosts& costs, const std::string& job, const std::string& node) {
  return costs.rank + StringHeapBytes(job) + StringHeapBytes(node);
}

int64_t NodeTextBytes(const NodeSnapshot& v) {
  return kNodeNameCopies * StringHeapBytes(v.node) + StringHeapBytes(v.agent_id) +
         KeptBytes(v.info) + (v.host.has_value() ? KeptBytes(*v.host) : 0);
}

int64_t GpuBytes(const MemoryCosts& costs, const v1::GpuSample& sample, const std::string& node) {
  return costs.gpu + KeptBytes(sample) + StringHeapBytes(node);
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
  accounted_bytes_ -= it->second.charged_bytes;  // its ranks' pods included
  rank_pods_.EraseJob(job);
  rank_pods_changed_ = true;
  if (!it->second.opened_by.empty()) {
    auto opened = jobs_opened_.find(it->second.opened_by);
    if (opened != jobs_opened_.end() && --opened->second <= 0) jobs_opened_.erase(opened);
  }
  jobs_.erase(it);
}

std::map<std::string, CollectorState::NodeTrack>::iterator CollectorState::EraseNode(
    std::map<std::string, NodeTrack>::iterator node) {
  int64_t charged = costs_.node + node->second.text_bytes;
  for (const v1::GpuSample& g : node->second.view.gpus) charged += GpuBytes(costs_, g, node->first);
  accounted_bytes_ -= charged;
  return nodes_.erase(node);
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

}  // namespace stepwatch::collector
