#include "analysis/detectors/straggler.h"

#include <algorithm>
#include <cmath>

#include "analysis/causes.h"
#include "analysis/finding.h"
#include "analysis/stats.h"

namespace stepwatch::analysis {

RankScores& StragglerState::Mutable(int rank, int window) {
  if (static_cast<size_t>(rank) >= ranks_.size()) ranks_.resize(rank + 1);
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

void StragglerDetector::ScoreGroup(const JobView& view, const StepView& step, size_t begin,
                                   size_t end, StragglerState& st) {
  const EngineOptions& opt = view.options;
  const std::vector<Entry>& es = step.entries;
  // Ranks whose split is unknown (step time only) say nothing about who is slower.
  peers_.clear();
  for (size_t i = begin; i < end; ++i) {
    if (!es[i].unknown_split) peers_.push_back(i);
  }
  const size_t n = peers_.size();
  double ref = 0, ref_compute = 0, ref_data = 0, sigma = 0;
  auto median_of = [&](double Entry::*field) {
    scratch_.clear();
    for (size_t i : peers_) scratch_.push_back(es[i].*field);
    return MedianInPlace(scratch_);
  };
  if (n >= 3) {
    ref = median_of(&Entry::busy);
    for (double& v : scratch_) v = std::fabs(v - ref);
    double mad = MedianInPlace(scratch_);
    sigma = ref > 0 ? kMadToSigma * mad / ref : 0;
    ref_compute = median_of(&Entry::compute);
    ref_data = median_of(&Entry::data);
  }
  if (n >= 2) {
    // Persistent differences between peers (heterogeneous hardware, uneven shards) inflate the
    // spread across ranks but not the noise of a rank's own ratio over time, which is what the
    // window mean has to beat. Once ranks have history, use the median over peers of that
    // temporal noise. Two peers have no robust spread at all: until then the margins alone hold.
    scratch_.clear();
    for (size_t i : peers_) {
      const RankScores* r = st.Of(es[i].rank);
      const double k = r == nullptr ? 0 : r->scores.size();
      if (2 * k < opt.straggler_window) continue;
      const double mean = r->sum_ratio / k;
      scratch_.push_back(std::sqrt(std::max(0.0, r->sum_ratio_sq / k - mean * mean)));
    }
    if (2 * scratch_.size() >= n) sigma = MedianInPlace(scratch_);
  }
  if (n < 2) return;  // nobody to compare with
  for (size_t k = 0; k < n; ++k) {
    const Entry& e = es[peers_[k]];
    double rank_ref = ref, rank_ref_compute = ref_compute, rank_ref_data = ref_data;
    bool waits_less = true;
    if (n == 2) {
      // No majority: compare with the other rank. The slower one is busier and waits less (the
      // faster one waits for it in the collective).
      const Entry& other = es[peers_[1 - k]];
      rank_ref = other.busy;
      rank_ref_compute = other.compute;
      rank_ref_data = other.data;
      waits_less = e.wait < other.wait;
    }
    // A forgotten rank's entry (its node was removed since it reported) is no evidence either.
    if (rank_ref <= 0 || e.stale || e.forgotten) continue;
    RankScores& r = st.Mutable(e.rank, opt.straggler_window);
    Score sc;
    sc.step = step.step;
    sc.busy = e.busy;
    sc.ref = rank_ref;
    sc.compute = e.compute;
    sc.ref_compute = rank_ref_compute;
    sc.data = e.data;
    sc.ref_data = rank_ref_data;
    sc.sigma = sigma;
    sc.over = e.busy / rank_ref - 1 > opt.straggler_rel_margin && waits_less;
    sc.split = e.split;
    Score old;
    if (r.scores.Push(sc, &old)) {
      r.sum_ratio -= old.busy / old.ref;
      r.sum_excess -= old.busy - old.ref;
      r.sum_sigma -= old.sigma;
      r.sum_ratio_sq -= (old.busy / old.ref) * (old.busy / old.ref);
      r.over_count -= old.over ? 1 : 0;
    }
    r.sum_ratio += sc.busy / sc.ref;
    r.sum_excess += sc.busy - sc.ref;
    r.sum_sigma += sc.sigma;
    r.sum_ratio_sq += (sc.busy / sc.ref) * (sc.busy / sc.ref);
    r.over_count += sc.over ? 1 : 0;
    const bool was = r.flagged;
    Evaluate(opt, r, step.step, step.nanos, step.step_seconds);
    if (was != r.flagged) st.flags_changed = true;
  }
}

void StragglerDetector::Evaluate(const EngineOptions& opt, RankScores& r, int64_t step,
                                 int64_t nanos, double step_seconds) {
  const double n = r.scores.size();
  if (r.flagged) ++r.flagged_steps;
  if (static_cast<int>(n) < opt.straggler_window) return;
  const double rel = r.sum_ratio / n - 1;
  const double excess = r.sum_excess / n;
  const double margin =
      std::max(opt.straggler_rel_margin, opt.straggler_noise_z * (r.sum_sigma / n) / std::sqrt(n));
  const double abs_margin =
      std::max(opt.straggler_abs_margin_seconds, opt.straggler_step_fraction * step_seconds);
  if (!r.flagged) {
    if (rel > margin && excess > abs_margin && r.over_count > opt.straggler_over_share * n) {
      r.flagged = true;
      r.flagged_steps = 0;
      // The episode began at the first over-margin step of the current run in the window.
      r.flagged_since_step = step;
      r.flagged_since_nanos = nanos;
      for (size_t i = r.scores.size(); i-- > 0;) {
        if (!r.scores[i].over) break;
        r.flagged_since_step = r.scores[i].step;
      }
    }
  } else if (rel < margin * opt.straggler_clear_share ||
             excess < abs_margin * opt.straggler_clear_share) {
    r.flagged = false;
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
  DeviceEvidence dev;
  dev.rank = rank;
  const std::vector<Cause> causes =
      DeviceCauses(g, view.registry.hosts(), r.node, view.options, &dev);
  if (f->evidence.data_excess_seconds) {
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
    f.gpu = r.gpu >= 0 ? r.gpu : (r.local_rank >= 0 ? r.local_rank : (g ? g->last.index : -1));
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
  if (out->comparable) out->busy_vs_median_ratio = sc->sum_ratio / sc->scores.size();
  out->straggler = sc != nullptr && sc->flagged;
}

}  // namespace stepwatch::analysis
