#include "analysis/detectors/pipeline.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "analysis/causes.h"
#include "analysis/finding.h"
#include "analysis/stats.h"
#include "analysis/window.h"

namespace stepwatch::analysis {

std::unique_ptr<DetectorState> PipelineDetector::NewJobState(const EngineOptions&, int) const {
  return std::make_unique<PipelineState>();
}

void PipelineDetector::OnStep(const JobView& view, const StepView& step, DetectorState* state) {
  const std::vector<Entry>& es = step.entries;
  // A step with stages: the first rank of some peer group has one.
  bool any_stage = false;
  for (size_t i = 0; i < es.size() && !any_stage; ++i) {
    any_stage = (i == 0 || es[i].group != es[i - 1].group) && es[i].pp_stage >= 0;
  }
  if (!any_stage) return;
  auto& job = *static_cast<PipelineState*>(state);
  const EngineOptions& opt = view.options;
  std::map<int, std::vector<double>> per_stage;
  for (const Entry& e : es) {
    if (e.pp_stage >= 0) per_stage[e.pp_stage].push_back(e.busy);
  }
  for (auto& [stage, v] : per_stage) {
    auto it = job.stages.find(stage);
    if (it == job.stages.end()) {
      it = job.stages.emplace(stage, PipelineState::Stage{Ring<float>(opt.straggler_window), 0})
               .first;
    }
    float m = MedianInPlace(v), old = 0;
    if (it->second.medians.Push(m, &old)) it->second.sum -= old;
    it->second.sum += m;
  }
  if (job.stages.size() < 2) return;
  int worst = -1;
  double worst_mean = -1;
  std::vector<std::pair<int, double>> means;
  for (const auto& [stage, st] : job.stages) {
    if (!st.medians.full()) return;
    double mean = st.sum / st.medians.size();
    means.push_back({stage, mean});
    if (mean > worst_mean) {
      worst_mean = mean;
      worst = stage;
    }
  }
  std::vector<double> others;
  for (const auto& [stage, mean] : means) {
    if (stage != worst) others.push_back(mean);
  }
  double others_median = MedianInPlace(others);
  if (others_median <= 0) return;
  double ratio = worst_mean / others_median;
  if (!job.imbalanced && ratio >= opt.pipeline_ratio) {
    job.imbalanced = true;
    job.since_step = step.step;
    job.since_nanos = step.nanos;
  } else if (job.imbalanced && ratio < opt.pipeline_clear_ratio) {
    job.imbalanced = false;
  }
  job.stage = worst;
  job.ratio = ratio;
  job.stage_s = worst_mean;
  job.others_s = others_median;
}

void PipelineDetector::Evaluate(const JobView& view, const DetectorState* state,
                                std::vector<Finding>* out) const {
  const auto& st = *static_cast<const PipelineState*>(state);
  if (!st.imbalanced) return;
  const JobRecord& job = view.job;
  Finding f = JobFinding(FindingKind::kPipelineImbalance, job.name, st.since_step, st.since_nanos);
  f.stage = st.stage;
  f.evidence.stage_vs_median_ratio = st.ratio;
  f.evidence.stage_busy_seconds = st.stage_s;
  f.evidence.other_stages_busy_seconds = st.others_s;
  constexpr size_t kShown = 4;  // nodes and devices kept as evidence
  std::vector<int> ranks;
  std::set<std::string> nodes;
  for (int i = 0; i < job.world_size; ++i) {
    const RankInfo& r = job.ranks[i];
    if (!r.present || r.pp_stage != st.stage) continue;
    ranks.push_back(i);
    nodes.insert(r.node);
    DeviceEvidence dev;
    dev.rank = i;
    const std::vector<Cause> causes =
        DeviceCauses(view.registry.GpuOf(r), view.registry.hosts(), r.node, view.options, &dev);
    if (causes.empty()) continue;
    for (Cause c : causes) AddCause(c, &f.causes);
    if (f.evidence.devices.size() < kShown) f.evidence.devices.push_back(std::move(dev));
  }
  if (nodes.size() == 1) f.node = *nodes.begin();
  f.evidence.node_count = static_cast<int64_t>(nodes.size());
  f.evidence.nodes.assign(nodes.begin(), std::next(nodes.begin(), std::min(nodes.size(), kShown)));
  if (f.causes.empty()) f.causes.push_back(Cause::kMoreWork);
  HealthFirst(&f.causes);
  f.cause = f.causes[0];
  f.ranks = BoundedRanks(std::move(ranks), view.options.max_finding_ranks);
  out->push_back(std::move(f));
}

void PipelineDetector::AnnotateRank(const JobView& view, const DetectorState* state, int rank,
                                    RankSnapshot* out) const {
  const auto& st = *static_cast<const PipelineState*>(state);
  if (st.imbalanced && view.job.ranks[rank].pp_stage == st.stage) out->straggler = true;
}

}  // namespace stepwatch::analysis
