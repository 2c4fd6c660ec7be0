#include "analysis/detectors/slow_node.h"

#include <algorithm>
#include <cstdint>

#include "analysis/causes.h"
#include "analysis/detectors/straggler.h"
#include "analysis/finding.h"
#include "analysis/health_tracker.h"

namespace stepwatch::analysis {

std::unique_ptr<DetectorState> SlowNodeDetector::NewJobState(const EngineOptions&, int) const {
  return std::make_unique<SlowNodeState>();
}

void SlowNodeDetector::OnStep(const JobView& view, const StepView& step, DetectorState* state) {
  auto& st = *static_cast<SlowNodeState*>(state);
  const auto& flags = *view.StateOf<StragglerState>(straggler_->slot());
  if (!flags.flags_changed && st.nodes.empty()) return;
  const JobRecord& job = view.job;
  struct Count {
    int present = 0, flagged = 0;
    int64_t since_step = INT64_MAX, since_nanos = 0;
  };
  std::map<std::string, Count> counts;
  for (int i = 0; i < job.world_size; ++i) {
    const RankInfo& r = job.ranks[i];
    if (!r.present || r.node.empty()) continue;
    Count& c = counts[r.node];
    ++c.present;
    const RankScores* sc = flags.Of(i);
    if (sc == nullptr || !sc->flagged) continue;
    ++c.flagged;
    if (sc->flagged_since_step < c.since_step) {
      c.since_step = sc->flagged_since_step;
      c.since_nanos = sc->flagged_since_nanos;
    }
  }
  for (const auto& [node, c] : counts) {
    auto it = st.nodes.find(node);
    if (it == st.nodes.end()) {
      // A node holding more than half the job is the job, not one slow node; one of two nodes is
      // (the straggler reference is the healthy half).
      if (c.present >= view.options.slow_node_min_ranks && c.flagged == c.present &&
          2 * c.present <= job.present_ranks) {
        st.nodes[node] = SlowNodeState::NodeSlow{c.since_step, c.since_nanos};
      }
    } else if (c.flagged == 0) {
      st.nodes.erase(it);
    } else if (c.flagged >= view.options.slow_node_clear_share * c.present) {
      it->second.under_half_since = -1;
    } else if (it->second.under_half_since < 0) {
      it->second.under_half_since = step.step;
    } else if (step.step - it->second.under_half_since >= view.options.straggler_window) {
      st.nodes.erase(it);
    }
  }
  for (auto it = st.nodes.begin(); it != st.nodes.end();) {
    it = counts.count(it->first) == 0 ? st.nodes.erase(it) : std::next(it);
  }
}

Finding SlowNodeDetector::NodeFinding(const JobView& view, const std::string& node,
                                      const SlowNodeState::NodeSlow& st) const {
  const JobRecord& job = view.job;
  const EngineOptions& opt = view.options;
  const auto& flags = *view.StateOf<StragglerState>(straggler_->slot());
  Finding f;
  f.kind = FindingKind::kSlowNode;
  f.job = job.name;
  f.node = node;
  f.since_step = st.since_step;
  f.since_unix_nanos = st.since_nanos;
  double ratio = 0;
  int count = 0;
  const RankScores* sample_rank = nullptr;
  bool sampled = false;
  std::vector<int> flagged;
  for (int i = 0; i < job.world_size; ++i) {
    const RankInfo& r = job.ranks[i];
    if (!r.present || r.node != node) continue;
    const RankScores* sc = flags.Of(i);
    if (sc != nullptr) {
      f.persistent = f.persistent || sc->flagged_steps >= opt.persistent_steps;
      ratio += sc->MeanRatio();
      if (sc->flagged) flagged.push_back(i);
    }
    ++count;
    if (!sampled) {
      sampled = true;
      sample_rank = sc;
    }
    // Every GPU of the node's ranks: one throttled GPU may be the whole story.
    const GpuInfo* g = view.registry.GpuOf(r);
    if (g == nullptr) continue;
    DeviceEvidence dev;
    dev.rank = i;
    dev.node = node;
    dev.gpu = g->last.index;
    std::vector<Cause> causes;
    AddHealthFaults(g->health.faults(), &causes, &dev);
    for (Cause c : GpuSlowdowns(g->last, opt, &dev)) AddCause(c, &causes);
    if (causes.empty()) continue;
    for (Cause c : causes) AddCause(c, &f.causes);
    f.evidence.devices.push_back(std::move(dev));
  }
  // The node's network ports.
  if (auto host = view.registry.hosts().find(node); host != view.registry.hosts().end()) {
    DeviceEvidence nic;
    nic.node = node;
    AddHealthFaults(host->second.nics.faults(), &f.causes, &nic);
    if (!nic.health.empty()) f.evidence.devices.push_back(std::move(nic));
  }
  ratio /= std::max(1, count);
  f.severity = ratio >= opt.critical_ratio ? Severity::kCritical : Severity::kWarning;
  f.evidence.slow_rank_count = static_cast<int64_t>(flagged.size());
  f.evidence.node_rank_count = count;
  bool data = false;
  if (sample_rank != nullptr) {
    // Where the node's excess lies, read from its first rank.
    SplitOf(*sample_rank, &f.evidence);
    data = f.evidence.data_excess_seconds.has_value();
  }
  // The node's figure: the mean over its ranks of busy time vs the peers' median.
  f.evidence.busy_vs_median_ratio = ratio;
  double median = 0;
  if (std::optional<double> cpu = SaturatedHostCpu(view.registry.hosts(), node, opt, &median)) {
    AddCause(Cause::kHostCpu, &f.causes);
    DeviceEvidence host;
    host.node = node;
    host.host_cpu_ratio = cpu;
    host.host_cpu_median_ratio = median;
    f.evidence.devices.push_back(std::move(host));
  }
  if (data) f.causes.insert(f.causes.begin(), Cause::kDataLoading);
  HealthFirst(&f.causes);
  f.cause = f.causes.empty() ? Cause::kUnknown : f.causes[0];
  f.ranks = BoundedRanks(std::move(flagged), opt.max_finding_ranks);
  return f;
}

void SlowNodeDetector::Evaluate(const JobView& view, const DetectorState* state,
                                std::vector<Finding>* out) const {
  const auto& st = *static_cast<const SlowNodeState*>(state);
  if (st.nodes.empty()) return;
  out->erase(std::remove_if(out->begin(), out->end(),
                            [&](const Finding& f) {
                              return f.kind == FindingKind::kStraggler &&
                                     st.nodes.count(f.node) > 0;
                            }),
             out->end());
  std::vector<Finding> nodes;
  for (const auto& [node, slow] : st.nodes) nodes.push_back(NodeFinding(view, node, slow));
  out->insert(out->begin(), std::make_move_iterator(nodes.begin()),
              std::make_move_iterator(nodes.end()));
}

}  // namespace stepwatch::analysis
