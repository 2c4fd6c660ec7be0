#include "analysis/detectors/slow_node.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/causes.h"
#include "analysis/detectors/straggler.h"
#include "analysis/finding.h"

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
      if (c.present >= 2 && c.flagged == c.present && 2 * c.present < job.present_ranks) {
        st.nodes[node] = SlowNodeState::NodeSlow{c.since_step, c.since_nanos};
      }
    } else if (c.flagged == 0) {
      st.nodes.erase(it);
    } else if (2 * c.flagged >= c.present) {
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
  std::vector<std::string> gpu_texts;
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
    Evidence ev = GpuSlowdowns(g->last, opt);
    for (Cause c : ev.causes) AddCause(c, &f.causes);
    if (!ev.texts.empty()) {
      gpu_texts.push_back(absl::StrCat("GPU ", g->last.index, ": ", absl::StrJoin(ev.texts, ", ")));
    }
  }
  ratio /= std::max(1, count);
  f.severity = ratio >= opt.critical_ratio ? Severity::kCritical : Severity::kWarning;
  const int nflagged = static_cast<int>(flagged.size());
  f.summary = nflagged == count ? absl::StrFormat("%s: all %d ranks slow", node, count)
                                : absl::StrFormat("%s: %d of %d ranks slow", node, nflagged, count);
  absl::StrAppend(&f.summary, absl::StrFormat(", busy %+.0f%% vs median", (ratio - 1) * 100));
  bool data = false;
  if (sampled) {
    // A rank never scored has an empty window.
    const SplitView split = SplitOf(sample_rank != nullptr ? *sample_rank : RankScores());
    data = split.data;
    absl::StrAppend(&f.summary, "; ", split.text);
  }
  for (const std::string& t : gpu_texts) absl::StrAppend(&f.summary, "; ", t);
  if (std::optional<double> cpu = SaturatedHostCpu(view.registry.hosts(), node, opt)) {
    AddCause(Cause::kHostCpu, &f.causes);
    absl::StrAppend(&f.summary, "; host CPU ", Percent(*cpu));
  }
  if (data) f.causes.insert(f.causes.begin(), Cause::kDataLoading);
  f.cause = f.causes.empty() ? Cause::kUnknown : f.causes[0];
  // The node, not the job's partition, is at fault: drain or inspect it.
  if (f.cause == Cause::kDataLoading) {
    f.action = absl::StrCat("drain ", node, " or inspect its storage and data loading (more ",
                            "data-loader workers)");
  } else {
    f.action = DeviceAction(f.cause, node, -1);
  }
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
