#include "analysis/detectors/regression.h"

#include <algorithm>
#include <cmath>

#include "analysis/causes.h"
#include "analysis/finding.h"
#include "analysis/stats.h"
#include "analysis/window.h"

namespace stepwatch::analysis {
namespace {

// The standard deviation of the median of n normal draws is about sqrt(pi / 2) sigma / sqrt(n).
constexpr double kMedianSe = 1.2533;
// Mean absolute deviation to standard deviation (normal noise): the fallback when more than half
// of the values are equal and their MAD is 0.
constexpr double kMeanAbsToSigma = 1.2533;
// Wander of window medians: one scale-1 shift sampled per window while not flagged, the last 32
// kept; counted once 16 are there and their spread exceeds 1.25x what the per-step noise predicts.
constexpr int kShiftSamples = 32;
constexpr size_t kMinShiftSamples = 16;
constexpr double kWanderEvidence = 1.25;
// A part of the split rose measurably when its median rose by at least this share of the step's
// shift and this many standard errors of its own medians' difference.
constexpr double kPartShare = 0.25;
constexpr double kPartZ = 3;
// Steps with a known split needed on each side of the change point to tell what rose.
constexpr size_t kMinPartSteps = 3;

// The robust standard deviation of `v` around `center` (MAD x 1.4826; the mean absolute deviation
// x 1.2533 when more than half of the values equal the center). Reorders `v`.
double RobustSigma(std::vector<double>& v, double center) {
  if (v.empty()) return 0;
  double sum = 0;
  for (double& x : v) {
    x = std::abs(x - center);
    sum += x;
  }
  const double mad = MedianInPlace(v);
  if (mad > 0) return kMadToSigma * mad;
  return kMeanAbsToSigma * sum / static_cast<double>(v.size());
}

struct PartRise {
  Cause cause = Cause::kUnknown;
  std::optional<double> seconds;  // unset: split unknown; 0: no part rose measurably
};

// The part of the split that rose measurably with the step time, from the steps before the change
// point (`before`, indices into the history) to those after it: a straggler shows as imbalance, a
// slower network as exposed communication, a slower input pipeline as data loading; compute on
// every rank (new code or inputs, slower GPUs) has no single cause (unknown, with its rise).
PartRise RisenPart(const RegressionState& st, const std::vector<size_t>& before, size_t change,
                   double shift_seconds, std::vector<double>* a, std::vector<double>* b) {
  PartRise out;
  std::vector<size_t> after;
  for (size_t i = change; i < st.size(); ++i) {
    if (st.record(i).split_known) after.push_back(i);
  }
  std::vector<size_t> known_before;
  for (size_t i : before) {
    if (st.record(i).split_known) known_before.push_back(i);
  }
  if (known_before.size() < kMinPartSteps || after.size() < kMinPartSteps) return out;
  out.seconds = 0;
  struct Part {
    float RegressionState::StepRecord::*field;
    Cause cause;
  };
  static constexpr Part kParts[] = {
      {&RegressionState::StepRecord::exposed_comm, Cause::kExposedComm},
      {&RegressionState::StepRecord::imbalance, Cause::kImbalance},
      {&RegressionState::StepRecord::data, Cause::kDataLoading},
      {&RegressionState::StepRecord::compute, Cause::kUnknown},
  };
  const double nb = static_cast<double>(known_before.size());
  const double na = static_cast<double>(after.size());
  for (const Part& p : kParts) {
    a->clear();
    for (size_t i : known_before) a->push_back(st.record(i).*p.field);
    const double med_before = MedianInPlace(*a);
    const double sigma_before = RobustSigma(*a, med_before);
    b->clear();
    for (size_t i : after) b->push_back(st.record(i).*p.field);
    const double med_after = MedianInPlace(*b);
    const double rise = med_after - med_before;
    // The part's own noise before the change, as the step's test takes the reference's.
    const double se = kMedianSe * sigma_before * std::sqrt(1 / nb + 1 / na);
    if (rise <= 0 || rise < kPartShare * shift_seconds || rise < kPartZ * se) continue;
    if (rise > *out.seconds) {
      out.seconds = rise;
      out.cause = p.cause;
    }
  }
  return out;
}

}  // namespace

void SortedWindow::Insert(float x) { v_.insert(std::upper_bound(v_.begin(), v_.end(), x), x); }

void SortedWindow::Erase(float x) {
  auto it = std::lower_bound(v_.begin(), v_.end(), x);
  if (it != v_.end() && *it == x) v_.erase(it);
}

double SortedWindow::Median() const {
  const size_t n = v_.size();
  if (n == 0) return 0;
  if (n % 2 == 1) return v_[n / 2];
  return (static_cast<double>(v_[n / 2 - 1]) + v_[n / 2]) / 2;
}

double SortedWindow::Mad(double center) const {
  const size_t n = v_.size();
  if (n == 0) return 0;
  // The deviations in increasing order merge two sorted runs: leftwards and rightwards from the
  // center.
  size_t right = static_cast<size_t>(std::lower_bound(v_.begin(), v_.end(), center) - v_.begin());
  size_t left = right;        // the next one leftwards is left - 1
  const size_t want = n / 2;  // the (want)-th deviation, 0-based; and the one before when even
  double prev = 0, cur = 0;
  for (size_t k = 0; k <= want; ++k) {
    const bool take_left = left > 0 && (right == n || center - v_[left - 1] <= v_[right] - center);
    prev = cur;
    cur = take_left ? center - v_[--left] : v_[right++] - center;
  }
  return n % 2 == 1 ? cur : (prev + cur) / 2;
}

double SortedWindow::MeanAbsDeviation(double center) const {
  if (v_.empty()) return 0;
  double sum = 0;
  for (float x : v_) sum += std::abs(x - center);
  return sum / static_cast<double>(v_.size());
}

RegressionState::RegressionState(int window, int reference, int warmup)
    : shifts(kShiftSamples),
      window_(std::max(window, 1)),
      reference_(std::max(reference, 1)),
      min_reference_(std::min(reference_, 3 * window_)),
      capacity_(static_cast<size_t>(lag() + reference_)),
      records_(capacity_),
      logs_(2 * capacity_),
      reference_from_(std::max(warmup, 0)) {}

void RegressionState::Push(const StepRecord& record) {
  const float log_step = static_cast<float>(std::log(record.seconds));
  const size_t lag_steps = static_cast<size_t>(lag());
  // The recent windows slide by one.
  for (int k = 0; k < 3; ++k) {
    const size_t len = static_cast<size_t>(window_) << k;
    if (size_ >= len) recent_[k].Erase(logs(size_ - len)[0]);
    recent_[k].Insert(log_step);
  }
  size_t slot;
  if (size_ == capacity_) {
    // The oldest step leaves the reference (when it was one).
    if (reference(0)) reference_set_.Erase(logs(0)[0]);
    slot = head_;
    head_ = (head_ + 1) % capacity_;
  } else {
    slot = size_++;
  }
  records_[slot] = record;
  logs_[slot] = log_step;
  logs_[slot + capacity_] = log_step;
  ++steps_seen_;
  // The step lag() steps back joins the reference region.
  if (size_ > lag_steps && reference(size_ - lag_steps - 1)) {
    reference_set_.Insert(logs(size_ - lag_steps - 1)[0]);
  }
}

std::unique_ptr<DetectorState> RegressionDetector::NewJobState(const EngineOptions& options,
                                                               int) const {
  return std::make_unique<RegressionState>(options.regression_window, options.regression_reference,
                                           options.regression_warmup_steps);
}

double RegressionDetector::MedianSeconds(const RegressionState& st, size_t from, size_t to) {
  scratch_.clear();
  for (size_t i = from; i < to; ++i) scratch_.push_back(st.record(i).seconds);
  return MedianInPlace(scratch_);
}

double RegressionDetector::MedianLog(const RegressionState& st, size_t from, size_t to) {
  const float* v = st.logs(from);
  scratch2_.assign(v, v + (to - from));
  return MedianInPlace(scratch2_);
}

void RegressionDetector::OnStep(const JobView& view, const StepView& step, DetectorState* state) {
  auto& st = *static_cast<RegressionState*>(state);
  const EngineOptions& o = view.options;
  if (!(step.step_seconds > 0) || !std::isfinite(step.step_seconds)) return;
  RegressionState::StepRecord rec;
  rec.step = step.step;
  rec.nanos = step.nanos;
  rec.seconds = step.step_seconds;
  const Ring<StepSummary>& sums = view.job.summaries;
  if (!sums.empty() && sums.back().step == step.step && sums.back().split_known) {
    const StepSummary& x = sums.back();
    rec.split_known = true;
    rec.exposed_comm = static_cast<float>(x.exposed_comm);
    rec.imbalance = static_cast<float>(x.max_busy - x.med_busy);
    rec.data = static_cast<float>(x.med_data);
    rec.compute = static_cast<float>(std::max(0.0, x.med_busy - x.med_data));
  }
  st.Push(rec);
  if (st.regressed) {
    Follow(o, st);
    return;
  }

  // The reference: the reference steps older than the last lag() steps; its robust noise (MAD x
  // 1.4826, or the mean absolute deviation x 1.2533 when more than half of the steps are equal).
  const size_t n = st.size();
  const size_t lag = static_cast<size_t>(st.lag());
  const SortedWindow& ref = st.reference_logs();
  if (n <= lag || ref.size() < static_cast<size_t>(st.min_reference())) return;
  const double nref = static_cast<double>(ref.size());
  const double reference = ref.Median();
  const double mad = ref.Mad(reference);
  const double sigma =
      mad > 0 ? kMadToSigma * mad : kMeanAbsToSigma * ref.MeanAbsDeviation(reference);
  ++st.tests;

  // The noise of a window median against the reference median: what the steps' MAD predicts for
  // independent steps, plus the wander of window medians beyond it once it is clearly there.
  const size_t window = static_cast<size_t>(st.window());
  auto iid_var = [&](size_t recent) {
    return kMedianSe * kMedianSe * sigma * sigma * (1 / static_cast<double>(recent) + 1 / nref);
  };
  double wander_var = 0;
  if (st.shifts.size() >= kMinShiftSamples) {
    const double spread2 = st.shift_spread * st.shift_spread;
    const double base = iid_var(window);
    if (spread2 > kWanderEvidence * kWanderEvidence * base) wander_var = spread2 - base;
  }

  const double min_shift = std::log1p(o.regression_threshold);
  const double z = std::max(o.regression_z, 0.0);
  double first_shift = 0;
  for (int k = 0; k < 3; ++k) {
    const size_t scale = window << k;
    const double shift = st.recent_logs(k).Median() - reference;
    if (k == 0) first_shift = shift;
    if (st.tests >= st.retry_at && shift >= min_shift &&
        shift * shift >= z * z * (iid_var(scale) + wander_var)) {
      if (TryRaise(st, scale, o.regression_threshold)) return;
      // A drift, not a step: the search is not repeated for a window's steps.
      st.retry_at = st.tests + static_cast<int64_t>(window);
      break;
    }
  }
  if (st.tests % static_cast<int64_t>(window) == 0) {
    st.shifts.Push(static_cast<float>(first_shift));
    scratch2_.clear();
    for (size_t i = 0; i < st.shifts.size(); ++i) scratch2_.push_back(std::abs(st.shifts[i]));
    st.shift_spread = kMadToSigma * MedianInPlace(scratch2_);
  }
}

void RegressionDetector::Follow(const EngineOptions& o, RegressionState& st) {
  const size_t n = st.size();
  const size_t window = static_cast<size_t>(st.window());
  ++st.steps_since;
  const size_t since =
      std::min({static_cast<size_t>(st.steps_since), n, static_cast<size_t>(st.lag())});
  st.level = MedianSeconds(st, n - since, n);
  // Hysteresis: back under the clear level over the steps since the change point, at most as
  // many as the window that found it and at least 2 x window (one window's median dips too often
  // in noisy jobs), once a whole window has passed since the change point.
  const size_t clear = std::min(since, std::max(static_cast<size_t>(st.scale), 2 * window));
  if (clear < window) return;
  const double recent = clear == since ? st.level : MedianSeconds(st, n - clear, n);
  if (recent < st.baseline * (1 + o.regression_threshold * o.regression_clear_share)) {
    st.regressed = false;
    st.rise_seconds.reset();
    st.cause = Cause::kUnknown;
    // A fresh reference from here on: the steps of the regression are none, and a new one needs
    // the whole test again.
    st.FreshReference();
  }
}

bool RegressionDetector::TryRaise(RegressionState& st, size_t scale, double threshold) {
  const size_t n = st.size();
  const size_t lag = std::min(n, static_cast<size_t>(st.lag()));
  const size_t first = n - lag;
  const size_t local = static_cast<size_t>(st.min_reference());
  const size_t start = first - std::min(first, local);
  // The change point: the split that fits best in absolute deviations from the medians of the
  // steps before it (from `local` steps before the last lag() on) and after it, with the after
  // level the higher one; it lies in the last lag() steps, at least half of the window that found
  // the shift after it.
  const size_t last = n - std::min(lag, (scale + 1) / 2);
  size_t change = 0;
  double best_cost = -1;
  auto deviation = [&](size_t from, size_t to, double* median) {
    *median = MedianLog(st, from, to);
    const float* v = st.logs(from);
    double cost = 0;
    for (size_t i = 0; i < to - from; ++i) cost += std::abs(v[i] - *median);
    return cost;
  };
  for (size_t j = std::max(first, start + 1); j <= last; ++j) {
    double before = 0, after = 0;
    const double cost = deviation(start, j, &before) + deviation(j, n, &after);
    if (after <= before) continue;
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      change = j;
    }
  }
  if (best_cost < 0) return false;

  // The baseline: the median of the last reference steps before the change point (as many as a
  // reference needs at least); the level: the median since. A slow drift rather than a step fits
  // no change point that clears the threshold: no regression.
  std::vector<size_t> before;
  for (size_t i = change; i-- > 0 && before.size() < local;) {
    if (st.reference(i)) before.push_back(i);
  }
  if (before.empty()) return false;
  scratch_.clear();
  for (size_t i : before) scratch_.push_back(st.record(i).seconds);
  const double baseline = MedianInPlace(scratch_);
  const double level = MedianSeconds(st, change, n);
  if (!(baseline > 0) || level < baseline * (1 + threshold)) return false;
  st.regressed = true;
  st.baseline = baseline;
  st.level = level;
  st.scale = static_cast<int>(scale);
  st.since_step = st.record(change).step;
  st.since_nanos = st.record(change).nanos;
  st.steps_since = static_cast<int64_t>(n - change);
  const PartRise part = RisenPart(st, before, change, level - baseline, &scratch_, &scratch2_);
  st.cause = part.cause;
  st.rise_seconds = part.seconds;
  return true;
}

void RegressionDetector::Evaluate(const JobView& view, const DetectorState* state,
                                  std::vector<Finding>* out) const {
  const auto& st = *static_cast<const RegressionState*>(state);
  if (!st.regressed || st.baseline <= 0) return;
  Finding f = JobFinding(FindingKind::kRegression, view.job.name, st.since_step, st.since_nanos);
  f.evidence.step_seconds = st.level;
  f.evidence.baseline_step_seconds = st.baseline;
  f.evidence.step_vs_baseline_ratio = st.level / st.baseline;
  f.evidence.rise_seconds = st.rise_seconds;
  SetCause(&f, st.cause);
  out->push_back(std::move(f));
}

}  // namespace stepwatch::analysis
