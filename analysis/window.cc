#include "analysis/window.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "analysis/stats.h"

namespace stepwatch::analysis {

absl::Status ValidateStepSample(const StepSample& s) {
  constexpr double kMaxSeconds = 86400;  // a step longer than a day is a bug, not a measurement
  if (s.job.empty()) return absl::InvalidArgumentError("step sample without job");
  if (s.world_size <= 0) return absl::InvalidArgumentError("world_size must be positive");
  if (s.rank < 0 || s.rank >= s.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", s.rank, " outside [0, ", s.world_size, ")"));
  }
  if (s.step < 0) return absl::InvalidArgumentError("negative step");
  if (!std::isfinite(s.step_s) || s.step_s <= 0 || s.step_s > kMaxSeconds) {
    return absl::InvalidArgumentError("step_s must be positive, finite and at most a day");
  }
  for (const auto* d : {&s.data_s, &s.compute_s, &s.comm_s}) {
    if (d->has_value() && (!std::isfinite(**d) || **d < 0 || **d > kMaxSeconds)) {
      return absl::InvalidArgumentError("durations must be non-negative, finite, at most a day");
    }
  }
  if (s.samples.has_value() && *s.samples < 0) {
    return absl::InvalidArgumentError("negative samples");
  }
  // As the agent's datagram contract says; a batch from elsewhere must not reach the peer-group
  // key (a negative pp_stage shifted left is undefined behaviour).
  for (const auto* i : {&s.local_rank, &s.gpu, &s.dp_rank, &s.pp_stage, &s.tp_rank}) {
    if (i->has_value() && **i < 0) {
      return absl::InvalidArgumentError("negative index (local_rank, gpu, dp/pp/tp rank)");
    }
  }
  return absl::OkStatus();
}

Entry MakeEntry(const StepSample& s) {
  Entry e;
  e.rank = s.rank;
  e.pp_stage = s.pp_stage.value_or(-1);
  if (s.pp_stage.has_value() || s.tp_rank.has_value()) {
    e.group = (static_cast<int64_t>(s.pp_stage.value_or(0)) << 32) |
              static_cast<uint32_t>(s.tp_rank.value_or(0));
  }
  e.step_s = s.step_s;
  e.data = s.data_s.value_or(0);
  if (s.compute_s.has_value() || s.data_s.has_value()) {
    e.compute = s.compute_s.value_or(0);
    e.busy = e.data + e.compute;
    e.wait = s.comm_s.has_value() ? *s.comm_s : std::max(0.0, s.step_s - e.busy);
    e.split = true;
  } else if (s.comm_s.has_value()) {
    // Only the wait is known: the rank that waits least is the one the others wait for.
    e.busy = std::max(0.0, s.step_s - *s.comm_s);
    e.compute = e.busy;
    e.wait = *s.comm_s;
  } else {
    e.busy = s.step_s;
    e.compute = s.step_s;
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
  for (const Entry& e : es) v.push_back(e.step_s);
  StepSummary sum;
  sum.step = step;
  sum.nanos = nanos;
  sum.step_s = MedianInPlace(v);
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
  for (size_t i = 0; i < summaries.size(); ++i) scratch->push_back(summaries[i].step_s);
  return MedianInPlace(*scratch);
}

void FillWindowFigures(const Ring<StepSummary>& summaries, JobSnapshot* snap) {
  JobSnapshot& s = *snap;
  if (summaries.empty()) return;
  std::vector<double> v;
  s.median_step_s = MedianStep(summaries, &v);
  if (s.median_step_s > 0) s.steps_per_second = 1 / s.median_step_s;
  v.clear();
  for (size_t i = 0; i < summaries.size(); ++i) {
    if (summaries[i].samples >= 0) v.push_back(summaries[i].samples);
  }
  if (!v.empty() && s.median_step_s > 0) s.samples_per_second = MedianInPlace(v) / s.median_step_s;
  // Only steps whose split is known: a step time alone says nothing of where the time went.
  double step = 0, busy = 0, imbalance = 0, comm = 0, data = 0, hideable = 0;
  for (size_t i = 0; i < summaries.size(); ++i) {
    const StepSummary& x = summaries[i];
    if (!x.split_known) continue;
    s.split_known = true;
    step += x.step_s;
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
