#include "analysis/window.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "analysis/registry.h"
#include "analysis/stats.h"
#include "common/step_event_rules.h"

namespace stepwatch::analysis {

absl::Status ValidateStepEvent(const StepEvent& s) {
  // The datagram's rules (docs/step-event.md): a batch need not come from a real agent, and a
  // negative pp_stage would reach the peer-group key (shifted left: undefined behaviour).
  step_event::Fields f;
  f.job = s.job;
  f.rank = s.rank;
  f.world_size = s.world_size;
  f.step = s.step;
  f.step_seconds = s.step_seconds;
  f.data_seconds = s.data_seconds;
  f.compute_seconds = s.compute_seconds;
  f.comm_seconds = s.comm_seconds;
  f.samples = s.samples;
  f.local_rank = s.local_rank;
  f.gpu = s.gpu;
  f.dp_rank = s.dp_rank;
  f.pp_stage = s.pp_stage;
  f.tp_rank = s.tp_rank;
  f.sections = s.sections;
  return step_event::Validate(f);
}

Entry MakeEntry(const StepEvent& s) {
  Entry e;
  e.rank = s.rank;
  e.pp_stage = s.pp_stage.value_or(-1);
  if (s.pp_stage.has_value() || s.tp_rank.has_value()) {
    e.group = (static_cast<int64_t>(s.pp_stage.value_or(0)) << 32) |
              static_cast<uint32_t>(s.tp_rank.value_or(0));
  }
  e.step_seconds = s.step_seconds;
  e.data = s.data_seconds.value_or(0);
  if (s.compute_seconds.has_value() || s.data_seconds.has_value()) {
    e.compute = s.compute_seconds.value_or(0);
    e.busy = e.data + e.compute;
    e.wait = s.comm_seconds.has_value() ? *s.comm_seconds : std::max(0.0, s.step_seconds - e.busy);
    e.split = true;
  } else if (s.comm_seconds.has_value()) {
    // Only the wait is known: the rank that waits least is the one the others wait for.
    e.busy = std::max(0.0, s.step_seconds - *s.comm_seconds);
    e.compute = e.busy;
    e.wait = *s.comm_seconds;
  } else {
    e.busy = s.step_seconds;
    e.compute = s.step_seconds;
    e.wait = 0;
    e.step_only = true;
    e.unknown_split = true;
  }
  e.samples = s.samples.value_or(-1);
  return e;
}

namespace {

// What-if margins: a rank is a straggler when its busy time, and its recent busy level
// (RecentLevel, over kWhatIfLevelSteps steps), are over the healthy reference of its peers by
// this share and by this many seconds (the simulator's, sim/tracesim.h, and the straggler
// detector's defaults), and a group splits into a fast and a slow half when the middle of its
// busy times jumps by more than the gap.
constexpr double kWhatIfStragglerMargin = 0.05;
constexpr double kWhatIfStragglerAbsSeconds = 0.002;
constexpr double kWhatIfClusterGap = 0.10;
constexpr size_t kWhatIfLevelSteps = 9;

// The median of [first, last) (non-empty), reordering it.
double MedianOf(std::vector<double>::iterator first, std::vector<double>::iterator last) {
  const size_t n = last - first, mid = n / 2;
  std::nth_element(first, first + mid, last);
  if (n % 2 == 1) return first[mid];
  return (*std::max_element(first, first + mid) + first[mid]) / 2;
}

// One peer group's healthy reference busy time and the largest busy time still healthy, from
// this step's busy times `v` (reordered). 3 or more ranks: the median, unless the middle of the
// group jumps by more than kWhatIfClusterGap (half of the ranks slow together): then the median
// of the fast half; healthy up to the margins over it. 2 ranks: no reference, both as fast as
// the faster (`bound`). 1 rank: no peers, healthy.
struct Healthy {
  double ref = 0, limit = 0;
  bool bound = false;
};
Healthy HealthyOf(std::vector<double>& v) {
  Healthy h;
  const size_t n = v.size();
  if (n == 1) {
    h.ref = h.limit = v[0];
  } else if (n == 2) {
    h.ref = h.limit = std::min(v[0], v[1]);
    h.bound = v[0] != v[1];
  } else {
    const size_t lo_i = (n - 1) / 2;
    std::nth_element(v.begin(), v.begin() + lo_i, v.end());
    const double lo = v[lo_i];
    const double hi = n % 2 == 1 ? lo : *std::min_element(v.begin() + lo_i + 1, v.end());
    const bool split = lo > 0 && hi > lo * (1 + kWhatIfClusterGap);
    h.ref = split ? MedianOf(v.begin(), v.begin() + lo_i + 1) : (lo + hi) / 2;
    h.limit = std::max(h.ref * (1 + kWhatIfStragglerMargin), h.ref + kWhatIfStragglerAbsSeconds);
  }
  return h;
}

double Arrival(const Entry& e) { return std::max(e.busy, e.step_seconds - e.wait); }

// A rank's recent busy level: the median of this step's busy time and those of its last
// kWhatIfLevelSteps - 1 steps (fewer while it has fewer), so that one step's spike of a healthy
// rank is not taken for a straggler.
double RecentLevel(const Entry& e, const RankTable* ranks) {
  if (ranks == nullptr) return e.busy;
  const Ring<StepVals>& h = (*ranks)[e.rank].history;
  std::array<double, kWhatIfLevelSteps> v;
  size_t n = 0;
  v[n++] = e.busy;
  for (size_t i = h.size(); i > 0 && n < v.size(); --i) v[n++] = h[i - 1].busy;
  const size_t mid = n / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.begin() + n);
  if (n % 2 == 1) return v[mid];
  return (*std::max_element(v.begin(), v.begin() + mid) + v[mid]) / 2;
}

// A rank's arrival at the collective with the stragglers of its group fixed: a rank over the
// healthy limit in this step whose recent level is over it too gets the reference busy time.
// (Only ranks over the limit are looked up: a straggler's quick step stays as it was.)
double FixedArrival(const Entry& e, const Healthy& h, const RankTable* ranks) {
  if (e.busy <= h.limit || RecentLevel(e, ranks) <= h.limit) return Arrival(e);
  return Arrival(e) - e.busy + h.ref;
}

// The step's what-ifs under the data-parallel model of the step: a rank reaches the collective
// after its busy and other time (arrival = step - wait), the collective completes once the last
// rank arrived and takes the smallest wait `wait` (the last rank waited for nobody), so the step
// ends at max arrival + wait.
// - stragglers: in each peer group (pipeline stage and tensor rank; HealthyOf), a rank over the
//   healthy limit, now and in its recent level, gets the reference busy time (its other time
//   stays); the step then ends at the slowest healthy rank, one step's spike of a healthy rank
//   included.
// - overlap: the collective hides behind each rank's own compute.
// - data: every data wait removed; in a pipeline, also the first stage's smallest wait, which
//   delays every stage after it (a lower bound).
// - pipeline: the slowest stage's compute (the median of its ranks') down to the mean of the
//   stages' (an upper bound: fill and drain keep part of it).
// Linear in the ranks for a job without peer groups; a job with them sorts its ranks by group.
void WhatIfGains(const std::vector<Entry>& es, double wait, const RankTable* ranks,
                 std::vector<double>* scratch, StepSummary* sum) {
  std::vector<double>& v = *scratch;
  double max_arrival = 0, no_data = 0, overlapped = 0;
  bool grouped = false;
  for (const Entry& e : es) {
    const double a = Arrival(e);
    max_arrival = std::max(max_arrival, a);
    no_data = std::max(no_data, a - e.data);
    overlapped = std::max(overlapped, a + std::max(0.0, wait - e.compute));
    grouped = grouped || e.group != -1;
  }
  sum->gain_data = std::max(0.0, max_arrival - no_data);
  sum->gain_overlap = std::max(0.0, max_arrival + wait - overlapped);
  double fixed = 0;
  if (!grouped) {
    v.clear();
    for (const Entry& e : es) v.push_back(e.busy);
    const Healthy h = HealthyOf(v);
    sum->stragglers_bound = h.bound;
    for (const Entry& e : es) fixed = std::max(fixed, FixedArrival(e, h, ranks));
    sum->gain_stragglers = std::max(0.0, max_arrival - fixed);
    return;
  }
  // Peer groups, and pipeline stages: ranks ordered by stage, then group.
  std::vector<uint32_t> order(es.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::tie(es[a].pp_stage, es[a].group) < std::tie(es[b].pp_stage, es[b].group);
  });
  double max_stage = 0, stage_sum = 0, first_stage_data = -1;
  int stages = 0;
  for (size_t b = 0; b < order.size();) {
    size_t e = b;
    while (e < order.size() && es[order[e]].group == es[order[b]].group) ++e;
    v.clear();
    for (size_t i = b; i < e; ++i) v.push_back(es[order[i]].busy);
    const Healthy h = HealthyOf(v);
    sum->stragglers_bound = sum->stragglers_bound || h.bound;
    for (size_t i = b; i < e; ++i) fixed = std::max(fixed, FixedArrival(es[order[i]], h, ranks));
    b = e;
  }
  for (size_t b = 0; b < order.size();) {
    const int stage = es[order[b]].pp_stage;
    size_t e = b;
    while (e < order.size() && es[order[e]].pp_stage == stage) ++e;
    if (stage >= 0) {
      v.clear();
      for (size_t i = b; i < e; ++i) v.push_back(es[order[i]].compute);
      const double med = MedianOf(v.begin(), v.end());
      max_stage = std::max(max_stage, med);
      stage_sum += med;
      ++stages;
      for (size_t i = b; stage == 0 && i < e; ++i) {
        const double d = es[order[i]].data;
        first_stage_data = first_stage_data < 0 ? d : std::min(first_stage_data, d);
      }
    }
    b = e;
  }
  sum->gain_stragglers = std::max(0.0, max_arrival - fixed);
  if (stages >= 2) {
    sum->pipeline = true;
    sum->gain_pipeline = std::max(0.0, max_stage - stage_sum / stages);
    sum->gain_data = std::max(sum->gain_data, first_stage_data);
  }
}

}  // namespace

StepSummary Summarize(int64_t step, int64_t nanos, const std::vector<Entry>& es, int world_size,
                      std::vector<double>* scratch, const RankTable* ranks) {
  std::vector<double>& v = *scratch;
  v.clear();
  for (const Entry& e : es) v.push_back(e.step_seconds);
  StepSummary sum;
  sum.step = step;
  sum.nanos = nanos;
  sum.step_seconds = MedianInPlace(v);
  v.clear();
  double max_busy = 0, min_wait = es[0].wait, samples = 0;
  bool any_samples = false;
  for (const Entry& e : es) {
    v.push_back(e.busy);
    max_busy = std::max(max_busy, e.busy);
    min_wait = std::min(min_wait, e.wait);
    if (e.samples >= 0) {
      samples += e.samples;
      any_samples = true;
    }
  }
  sum.med_busy = MedianInPlace(v);
  sum.max_busy = max_busy;
  sum.exposed_comm = min_wait;
  sum.split_known =
      std::any_of(es.begin(), es.end(), [](const Entry& e) { return !e.unknown_split; });
  v.clear();
  for (const Entry& e : es) v.push_back(e.data);
  sum.med_data = MedianInPlace(v);
  // Ranks that did not report this step processed samples too: scale up to the world size.
  if (any_samples) sum.samples = samples * world_size / es.size();
  WhatIfGains(es, std::max(0.0, min_wait), ranks, scratch, &sum);
  return sum;
}

double MedianStep(const Ring<StepSummary>& summaries, std::vector<double>* scratch) {
  scratch->clear();
  for (size_t i = 0; i < summaries.size(); ++i) scratch->push_back(summaries[i].step_seconds);
  return MedianInPlace(*scratch);
}

const char* WhatIfKindName(WhatIfKind kind) {
  switch (kind) {
    case WhatIfKind::kEstimate:
      return "estimate";
    case WhatIfKind::kLowerBound:
      return "lower_bound";
    case WhatIfKind::kUpperBound:
      return "upper_bound";
  }
  return "estimate";
}

void FillWindowFigures(const Ring<StepSummary>& summaries, JobSnapshot* snap) {
  JobSnapshot& s = *snap;
  if (summaries.empty()) return;
  std::vector<double> v;
  s.median_step_seconds = MedianStep(summaries, &v);
  if (s.median_step_seconds > 0) s.steps_per_second = 1 / s.median_step_seconds;
  v.clear();
  for (size_t i = 0; i < summaries.size(); ++i) {
    if (summaries[i].samples >= 0) v.push_back(summaries[i].samples);
  }
  if (!v.empty() && s.median_step_seconds > 0)
    s.samples_per_second = MedianInPlace(v) / s.median_step_seconds;
  // Only steps whose split is known: a step time alone says nothing of where the time went.
  double step = 0, busy = 0, imbalance = 0, comm = 0, data = 0;
  double gain_stragglers = 0, gain_overlap = 0, gain_data = 0, gain_pipeline = 0;
  bool stragglers_bound = false, pipeline = false;
  for (size_t i = 0; i < summaries.size(); ++i) {
    const StepSummary& x = summaries[i];
    if (!x.split_known) continue;
    s.split_known = true;
    step += x.step_seconds;
    busy += x.med_busy;
    imbalance += x.max_busy - x.med_busy;
    comm += x.exposed_comm;
    data += x.med_data;
    gain_stragglers += x.gain_stragglers;
    gain_overlap += x.gain_overlap;
    gain_data += x.gain_data;
    gain_pipeline += x.gain_pipeline;
    stragglers_bound = stragglers_bound || x.stragglers_bound;
    pipeline = pipeline || x.pipeline;
  }
  if (!s.split_known || step <= 0) return;
  TimeBreakdown& b = s.breakdown;
  b.data = data / step;
  b.compute = std::max(0.0, busy - data) / step;
  b.imbalance = imbalance / step;
  b.comm = comm / step;
  double total = b.data + b.compute + b.imbalance + b.comm;
  if (total > 1) {
    b.data /= total;
    b.compute /= total;
    b.imbalance /= total;
    b.comm /= total;
    total = 1;
  }
  b.other = 1 - total;
  s.efficiency_ratio = std::min(1.0, busy / step);
  auto speedup = [step](double removed) {
    double rest = step - removed;
    return rest > 0 ? std::max(1.0, step / rest) : 1.0;
  };
  // The what-ifs sum each step's gain (WhatIfGains), checked against a trace-driven simulation
  // (sim/whatif_check.h): the breakdown's imbalance (max - median busy) would credit fixing the
  // stragglers with the healthy ranks' own spread, and a slow half of the ranks drags the median.
  WhatIf& w = s.whatif;
  w.stragglers = speedup(gain_stragglers);
  // In a pipeline a straggler's excess delays the step by at most itself (the other stages'
  // bubbles absorb part of it): an upper bound there too.
  w.stragglers_kind =
      stragglers_bound || pipeline ? WhatIfKind::kUpperBound : WhatIfKind::kEstimate;
  w.overlap = speedup(gain_overlap);
  w.overlap_kind = WhatIfKind::kUpperBound;
  w.data = speedup(gain_data);
  w.data_kind = pipeline ? WhatIfKind::kLowerBound : WhatIfKind::kEstimate;
  w.pipeline = pipeline ? speedup(gain_pipeline) : 1.0;
  w.pipeline_kind = pipeline ? WhatIfKind::kUpperBound : WhatIfKind::kEstimate;
}

}  // namespace stepwatch::analysis
