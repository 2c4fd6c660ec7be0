// Admission: what ingest lets in. Ranks bound to the node that holds them, caps on jobs, jobs per
// node, ranks, nodes and GPUs, string bounds (checked in convert.cc) and trusted timestamps.
#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/memory_budget.h"
#include "collector/published_state.h"
#include "collector/state.h"
#include "common/log.h"
#include "common/text.h"

namespace stepwatch::collector {

// Label values (job, node) are bounded: longer ones are refused, not truncated, so that two
// distinct names cannot collide. Names also reach terminals: no control characters. Every string
// a batch carries is bounded the same way (collector/convert.h, CheckBatchIdentifiers and the
// checks of its items).

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
  if (event.world_size() > engine_.options().max_ranks_per_job) {
    HitLimit("ranks_per_job");
    return a;
  }
  // The engine's registry says which jobs and ranks exist, and which node holds each rank (the
  // one its last step came from); the track keeps only the charges.
  const std::optional<analysis::JobHolding> held = engine_.JobHoldingOf(event.job());
  JobTrack* job = held.has_value() ? AdmitToKnownJob(event, node, now, *held, &a)
                                   : AdmitNewJob(event, node, &a);
  if (job == nullptr) return a;
  if (job->first_step < 0 || event.step() < job->first_step) job->first_step = event.step();
  if (job->first_seen_unix_nanos == 0) job->first_seen_unix_nanos = now;
  job->last_seen_unix_nanos = now;
  a.admitted = true;
  return a;
}

CollectorState::JobTrack* CollectorState::AdmitNewJob(const v1::StepEvent& event,
                                                      const std::string& node, Admission* a) {
  if (jobs_.contains(event.job())) EraseJob(event.job());  // never left behind; defensive
  if (engine_.JobCount() >= static_cast<size_t>(std::max(0, engine_.options().max_jobs))) {
    HitLimit("jobs");
    return nullptr;
  }
  auto opened = jobs_opened_.find(node);
  if (options_.max_jobs_per_node > 0 && opened != jobs_opened_.end() &&
      opened->second >= options_.max_jobs_per_node) {
    HitLimit("jobs_per_node");
    CountNodeRefusal(node, "jobs_per_node");
    return nullptr;
  }
  const int64_t rank_bytes = RankBytes(costs_, event.job(), node);
  const int64_t cost = NewJobBytes(costs_, event.job(), node, event.world_size(), rank_bytes);
  if (!Charge(cost, "job")) return nullptr;
  JobTrack& job = jobs_.emplace(event.job(), JobTrack{}).first->second;
  job.world_size_charged = event.world_size();
  job.ranks_charged = 1;
  job.charged_bytes = cost;
  job.rank_bytes = rank_bytes;
  job.opened_by = node;
  ++jobs_opened_[node];
  a->new_job = true;
  a->bytes = cost;
  a->ranks = 1;
  return &job;
}

CollectorState::JobTrack* CollectorState::AdmitToKnownJob(const v1::StepEvent& event,
                                                          const std::string& node, int64_t now,
                                                          const analysis::JobHolding& held,
                                                          Admission* a) {
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
      a->rejected = "foreign";
      return nullptr;
    }
    a->takeover = true;
  }
  // A new world size resets the job (a rescale): only a node that holds one of its ranks may do
  // that while other nodes' ranks still run it.
  if (event.world_size() != held.world_size && !holds_this_rank && held.running_ranks > 0 &&
      held.last_seen_unix_nanos >= held_since && !engine_.NodeHoldsRankOf(event.job(), node)) {
    CountNodeRefusal(node, "job_foreign");
    uint64_t suppressed = 0;
    if (foreign_log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "refusing steps of job " << event.job() << " from node " << node
                     << ": world size " << event.world_size() << " would reset the job (world "
                     << held.world_size << ") whose running ranks are all on other nodes"
                     << (suppressed > 0 ? absl::StrCat(" [", suppressed, " similar suppressed]")
                                        : std::string());
    }
    a->rejected = "foreign";
    return nullptr;
  }
  auto it = jobs_.find(event.job());
  if (it == jobs_.end()) {
    it = jobs_.emplace(event.job(), JobTrack{}).first;
    it->second.rank_bytes = RankBytes(costs_, event.job(), node);
  }
  JobTrack& job = it->second;
  if (event.world_size() > job.world_size_charged) {
    // A rescaled job: the engine's rank slots grow with it. Kept when the step is refused.
    const int64_t cost = costs_.rank_slot * (event.world_size() - job.world_size_charged);
    if (!Charge(cost, "rank")) return nullptr;
    job.world_size_charged = event.world_size();
    job.charged_bytes += cost;
  }
  // A rank the engine does not know yet, beyond the most it knew at once, costs one more.
  if (!holder.has_value() && held.present_ranks >= job.ranks_charged) {
    if (!Charge(job.rank_bytes, "rank")) return nullptr;
    job.charged_bytes += job.rank_bytes;
    ++job.ranks_charged;
    a->bytes = job.rank_bytes;
    a->ranks = 1;
  }
  return &job;
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
                   << "collector's time ("
                   << (sender > now ? "check NTP on that node"
                                    : "check NTP on that node, unless its agent kept these while "
                                      "the collector was unreachable")
                   << ")"
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
    NodeSnapshot view;
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

}  // namespace stepwatch::collector
