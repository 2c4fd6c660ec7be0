#include "analysis/detectors/straggler.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "analysis/causes.h"
#include "analysis/finding.h"
#include "analysis/stats.h"
#include "common/check.h"

namespace stepwatch::analysis {
RankScores& StragglerState::Mutable(int rank, int window) {
  if (static_cast<size_t>(rank) >= ranks_.size()) {
    ranks_.resize(rank + 1);
    exclusion_.resize(rank + 1);
  }
  if (!ranks_[rank]) {
    ranks_[rank] = std::make_unique<RankScores>();
    ranks_[rank]->scores = Ring<Score>(window);
  }
  return *ranks_[rank];
}

std::unique_ptr<DetectorState> StragglerDetector::NewJobState(const EngineOptions&, int) const {
  return std::make_unique<StragglerState>();
}

void StragglerDetector::OnStep(const JobView& view, const StepView& step, DetectorState* state) {
  auto& st = *static_cast<StragglerState*>(state);
  st.flags_changed = false;
  const std::vector<Entry>& es = step.entries;
  for (size_t begin = 0; begin < es.size();) {
    size_t end = begin;
    while (end < es.size() && es[end].group == es[begin].group) ++end;
    ScoreGroup(view, step, begin, end, st);
    begin = end;
  }
}

void StragglerDetector::OnRankRemoved(const JobView&, int rank, DetectorState* state) {
  static_cast<StragglerState*>(state)->Erase(rank);
}

void SplitOf(const RankScores& r, Evidence* e) {
  double busy = 0, ref = 0, compute = 0, ref_compute = 0, data = 0, ref_data = 0;
  bool split = false;
  for (size_t i = 0; i < r.scores.size(); ++i) {
    const Score& s = r.scores[i];
    split = split || s.split;
    busy += s.busy;
    ref += s.ref;
    compute += s.compute;
    ref_compute += s.ref_compute;
    data += s.data;
    ref_data += s.ref_data;
  }
  const double n = std::max<size_t>(1, r.scores.size());
  const double data_excess = (data - ref_data) / n, compute_excess = (compute - ref_compute) / n;
  if (data_excess > compute_excess && data_excess > 0) e->data_excess_seconds = data_excess;
  if (ref_compute > 0 && split) e->compute_vs_median_ratio = compute / ref_compute;
  if (ref > 0) e->busy_vs_median_ratio = busy / ref;
}

void StragglerDetector::Attribute(const JobView& view, int rank, const RankScores& sc,
                                  const GpuInfo* g, Finding* f) {
  const RankInfo& r = view.job.ranks[rank];
  SplitOf(sc, &f->evidence);
  // The section flagged with the largest excess, when the busy time alone is not flagged.
  if (!sc.busy.flagged) {
    double best = 0;
    for (size_t s = 0; s < sc.sections.size() && s < view.job.section_names.size(); ++s) {
      const SeriesTest& t = sc.sections[s];
      if (!t.flagged || t.Effect() <= best) continue;
      best = t.Effect();
      f->evidence.section = view.job.section_names[s];
      f->evidence.section_vs_reference_ratio = 1 + t.Effect();
    }
  }
  DeviceEvidence dev;
  dev.rank = rank;
  const std::vector<Cause> causes =
      DeviceCauses(g, view.registry.hosts(), r.node, view.options, &dev);
  if (f->evidence.data_excess_seconds && !f->evidence.section) {
    f->causes.push_back(Cause::kDataLoading);
    for (Cause c : causes) AddCause(c, &f->causes);
  } else if (!causes.empty()) {
    f->causes = causes;
  } else if (FullSpeedAndBusy(g, view.options)) {
    f->causes.push_back(Cause::kMoreWork);
    // Full clocks and a busy GPU are the evidence here.
    dev.sm_clock_mhz = g->last.sm_clock_mhz;
    dev.sm_clock_max_mhz = g->last.sm_clock_max_mhz;
    SetGpuBusy(*g, &dev);
  }
  f->evidence.devices.push_back(std::move(dev));
  HealthFirst(&f->causes);
  f->cause = f->causes.empty() ? Cause::kUnknown : f->causes[0];
}

void StragglerDetector::Evaluate(const JobView& view, const DetectorState* state,
                                 std::vector<Finding>* out) const {
  const auto& st = *static_cast<const StragglerState*>(state);
  const JobRecord& job = view.job;
  for (int i = 0; i < job.world_size; ++i) {
    const RankInfo& r = job.ranks[i];
    const RankScores* sc = st.Of(i);
    if (!r.present || sc == nullptr || !sc->flagged) continue;
    Finding f;
    f.kind = FindingKind::kStraggler;
    f.job = job.name;
    f.rank = i;
    f.ranks = {i};
    f.node = r.node;
    f.stage = r.pp_stage;
    const GpuInfo* g = view.registry.GpuOf(r);
    if (r.gpu < 0 && g == nullptr) {
      // No GPU is known for the rank (a CPU-only job): its local rank is no GPU index.
      f.local_rank = r.local_rank;
    } else {
      f.gpu = r.gpu >= 0 ? r.gpu : (r.local_rank >= 0 ? r.local_rank : g->last.index);
    }
    f.since_step = sc->flagged_since_step;
    f.since_unix_nanos = sc->flagged_since_nanos;
    f.persistent = sc->flagged_steps >= view.options.persistent_steps;
    f.severity =
        sc->MeanRatio() >= view.options.critical_ratio ? Severity::kCritical : Severity::kWarning;
    Attribute(view, i, *sc, g, &f);
    out->push_back(std::move(f));
  }
}

void StragglerDetector::AnnotateRank(const JobView&, const DetectorState* state, int rank,
                                     RankSnapshot* out) const {
  const RankScores* sc = static_cast<const StragglerState*>(state)->Of(rank);
  // Scores exist only where the rank had a peer to compare with and its split was known.
  out->comparable = sc != nullptr && !sc->scores.empty();
  if (out->comparable) out->busy_vs_median_ratio = sc->MeanRatio();
  out->straggler = sc != nullptr && sc->flagged;
}

}  // namespace stepwatch::analysis
