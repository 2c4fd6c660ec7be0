#include "analysis/detectors/regression.h"

#include <algorithm>

#include "analysis/causes.h"
#include "analysis/finding.h"
#include "analysis/stats.h"

namespace stepwatch::analysis {
namespace {

// The part of the step split that rose most from before the regression's first step to after it
// (per-step means): a straggler shows as imbalance, a slower network as exposed communication.
Cause RegressionCause(const Ring<StepSummary>& summaries, int64_t since_step,
                      std::optional<double>* rise) {
  rise->reset();
  struct Parts {
    double n = 0, comm = 0, imbalance = 0, data = 0, compute = 0;
  } before, after;
  for (size_t i = 0; i < summaries.size(); ++i) {
    const StepSummary& x = summaries[i];
    if (!x.split_known) continue;
    Parts& p = x.step < since_step ? before : after;
    ++p.n;
    p.comm += x.exposed_comm;
    p.imbalance += x.max_busy - x.med_busy;
    p.data += x.med_data;
    p.compute += std::max(0.0, x.med_busy - x.med_data);
  }
  if (before.n == 0 || after.n == 0) return Cause::kUnknown;
  struct Rise {
    double seconds;
    Cause cause;
  };
  const Rise rises[] = {
      {after.comm / after.n - before.comm / before.n, Cause::kExposedComm},
      {after.imbalance / after.n - before.imbalance / before.n, Cause::kImbalance},
      {after.data / after.n - before.data / before.n, Cause::kDataLoading},
      // Every rank computing longer: new code or inputs, or slower GPUs; no single cause.
      {after.compute / after.n - before.compute / before.n, Cause::kUnknown},
  };
  const Rise* best = nullptr;
  for (const Rise& r : rises) {
    if (r.seconds > 0 && (best == nullptr || r.seconds > best->seconds)) best = &r;
  }
  if (best == nullptr) return Cause::kUnknown;
  *rise = best->seconds;
  return best->cause;
}

}  // namespace

std::unique_ptr<DetectorState> RegressionDetector::NewJobState(const EngineOptions& options,
                                                               int) const {
  return std::make_unique<RegressionState>(options.regression_window, options.regression_reference);
}

void RegressionDetector::OnStep(const JobView& view, const StepView& step, DetectorState* state) {
  auto& st = *static_cast<RegressionState*>(state);
  const double threshold = view.options.regression_threshold;
  std::pair<int64_t, float> old;
  if (st.recent.Push({step.step, static_cast<float>(step.step_seconds)}, &old) && !st.regressed) {
    st.reference.Push(old.second);
  }
  if (!st.recent.full() || st.reference.size() < st.recent.capacity()) return;
  scratch_.clear();
  for (size_t i = 0; i < st.recent.size(); ++i) scratch_.push_back(st.recent[i].second);
  const double recent = MedianInPlace(scratch_);
  if (!st.regressed) {
    scratch_.clear();
    for (size_t i = 0; i < st.reference.size(); ++i) scratch_.push_back(st.reference[i]);
    const double base = MedianInPlace(scratch_);
    if (base <= 0 || recent < base * (1 + threshold)) return;
    st.regressed = true;
    st.baseline = base;
    // The shift began where a split of the recent window fits best: before at the baseline,
    // after at the mean of the rest.
    const size_t n = st.recent.size();
    size_t best = 0;
    double best_cost = -1;
    for (size_t j = 0; j < n; ++j) {
      double mean_after = 0;
      for (size_t i = j; i < n; ++i) mean_after += st.recent[i].second;
      mean_after /= (n - j);
      double cost = 0;
      for (size_t i = 0; i < n; ++i) {
        double level = i < j ? base : mean_after;
        double d = st.recent[i].second - level;
        cost += d * d;
      }
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        best = j;
      }
    }
    st.since_step = st.recent[best].first;
    st.since_nanos = step.nanos;
    st.cause = RegressionCause(view.job.summaries, st.since_step, &st.rise_seconds);
  } else if (recent <= st.baseline * (1 + threshold * view.options.regression_clear_share)) {
    st.regressed = false;
  }
  st.level = recent;
}

void RegressionDetector::Evaluate(const JobView& view, const DetectorState* state,
                                  std::vector<Finding>* out) const {
  const auto& st = *static_cast<const RegressionState*>(state);
  if (!st.regressed) return;
  Finding f = JobFinding(FindingKind::kRegression, view.job.name, st.since_step, st.since_nanos);
  f.evidence.step_seconds = st.level;
  f.evidence.baseline_step_seconds = st.baseline;
  f.evidence.step_vs_baseline_ratio = st.level / st.baseline;
  f.evidence.rise_seconds = st.rise_seconds;
  SetCause(&f, st.cause);
  out->push_back(std::move(f));
}

}  // namespace stepwatch::analysis
