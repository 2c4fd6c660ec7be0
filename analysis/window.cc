#include "analysis/window.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
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

StepSummary Summarize(int64_t step, int64_t nanos, const std::vector<Entry>& es, int world_size,
                      std::vector<double>* scratch) {
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
  return sum;
}

double MedianStep(const Ring<StepSummary>& summaries, std::vector<double>* scratch) {
  scratch->clear();
  for (size_t i = 0; i < summaries.size(); ++i) scratch->push_back(summaries[i].step_seconds);
  return MedianInPlace(*scratch);
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
  double step = 0, busy = 0, imbalance = 0, comm = 0, data = 0, hideable = 0;
  for (size_t i = 0; i < summaries.size(); ++i) {
    const StepSummary& x = summaries[i];
    if (!x.split_known) continue;
    s.split_known = true;
    step += x.step_seconds;
    busy += x.med_busy;
    imbalance += x.max_busy - x.med_busy;
    comm += x.exposed_comm;
    data += x.med_data;
    // Communication can only hide behind compute that exists in the same step.
    hideable += std::min(x.exposed_comm, std::max(0.0, x.med_busy - x.med_data));
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
  s.whatif.stragglers = speedup(imbalance);
  s.whatif.overlap = speedup(hideable);
  s.whatif.data = speedup(data);
}

}  // namespace stepwatch::analysis
