// Regressions: a robust change-point test on the job's step time. The medians of the recent
// windows (regression_window steps, twice and four times that) are compared with the median of a
// reference before them, in log step time, against the noise of medians that the steps' own MAD
// predicts (plus the job's measured wander of window medians, where it has one). A shift is a
// regression when it is both at least regression_threshold and regression_z standard errors; the
// step where it began, the levels before and after it and the part of the step that rose are
// fixed when it is raised and kept until it clears. docs/analysis.md has the rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/registry.h"
#include "analysis/ring.h"

namespace stepwatch::analysis {

// A multiset of floats kept sorted: insert, erase, median and MAD without a selection per query
// (the windows slide by one step per step).
class SortedWindow {
 public:
  size_t size() const { return v_.size(); }
  void Clear() { v_.clear(); }
  void Insert(float x);
  void Erase(float x);  // one element equal to x, if any
  // The median (the mean of the two middle values when even; 0 when empty).
  double Median() const;
  // The median absolute deviation from `center` (the same convention).
  double Mad(double center) const;
  // The mean absolute deviation from `center` (0 when empty).
  double MeanAbsDeviation(double center) const;

 private:
  std::vector<float> v_;
};

class RegressionState : public DetectorState {
 public:
  // One complete step as the detector keeps it.
  struct StepRecord {
    int64_t step = 0;
    int64_t nanos = 0;
    double seconds = 0;  // the job's (median) step time
    // The parts of the split (seconds), when split_known.
    float exposed_comm = 0;
    float imbalance = 0;
    float data = 0;
    float compute = 0;
    bool split_known = false;
  };

  RegressionState(int window, int reference, int warmup);

  int window() const { return window_; }
  // The recent windows are window, 2 x window and 4 x window steps; the reference ends lag()
  // steps before the newest step and holds up to reference_capacity() steps, at least
  // min_reference().
  int lag() const { return 4 * window_; }
  int reference_capacity() const { return reference_; }
  int min_reference() const { return min_reference_; }

  // The last lag() + reference_capacity() steps, oldest first.
  size_t size() const { return size_; }
  void Push(const StepRecord& record);
  const StepRecord& record(size_t i) const { return records_[(head_ + i) % capacity_]; }
  // log(seconds) of steps i, i + 1, ... (contiguous up to size()).
  const float* logs(size_t i) const { return &logs_[head_ + i]; }
  // Whether step i may serve as reference: after the warm-up, not flagged, not before the last
  // clear.
  bool reference(size_t i) const { return Seq(i) >= reference_from_; }
  // From the newest step on, the steps so far are no reference (a regression cleared).
  void FreshReference() {
    reference_from_ = steps_seen_;
    reference_set_.Clear();
  }
  // The logs of the reference steps (those older than the last lag() steps), and of the last
  // window() << k steps (k = 0, 1, 2).
  const SortedWindow& reference_logs() const { return reference_set_; }
  const SortedWindow& recent_logs(int k) const { return recent_[k]; }

  // Scale-1 shifts (recent window against the reference, log) sampled once per window while not
  // flagged, and their robust spread: how far window medians wander in this job beyond what the
  // per-step noise predicts (contention that comes and goes).
  Ring<float> shifts;
  double shift_spread = 0;
  int64_t tests = 0;
  int64_t retry_at = 0;  // no change-point search before this test (one found none)

  bool regressed = false;
  int64_t since_step = 0;
  int64_t since_nanos = 0;
  int64_t steps_since = 0;  // steps from the change point to the newest one (inclusive)
  int scale = 0;            // the recent window (steps) that found it
  double baseline = 0;      // median step time just before the change point (seconds)
  double level = 0;         // median step time since (seconds), over the last lag() steps
  // What rose with the step time and by how much per step, fixed when the regression is raised:
  // unset when the split is unknown, 0 (cause unknown) when no part rose measurably.
  Cause cause = Cause::kUnknown;
  std::optional<double> rise_seconds;

 private:
  int64_t Seq(size_t i) const { return steps_seen_ - static_cast<int64_t>(size_ - i); }

  int window_;
  int reference_;
  int min_reference_;
  size_t capacity_;
  std::vector<StepRecord> records_;
  std::vector<float> logs_;  // twice the capacity, mirrored: any run of steps is contiguous
  size_t head_ = 0;
  size_t size_ = 0;
  int64_t steps_seen_ = 0;
  int64_t reference_from_ = 0;
  SortedWindow reference_set_;
  SortedWindow recent_[3];
};

class RegressionDetector : public Detector {
 public:
  const char* name() const override { return "regression"; }
  unsigned hooks() const override { return kStep | kEvaluate; }
  std::unique_ptr<DetectorState> NewJobState(const EngineOptions& options,
                                             int world_size) const override;
  void OnStep(const JobView& view, const StepView& step, DetectorState* state) override;
  void Evaluate(const JobView& view, const DetectorState* state,
                std::vector<Finding>* job_findings) const override;

 private:
  // While flagged: follows the level and clears under the hysteresis.
  void Follow(const EngineOptions& options, RegressionState& st);
  // Raises the regression that the window of the last `scale` steps found, at its change point,
  // unless the levels around that point differ by less than `threshold` (a drift, not a step).
  bool TryRaise(RegressionState& st, size_t scale, double threshold);
  // The median step time (seconds) of steps [from, to) and the median of their logs.
  double MedianSeconds(const RegressionState& st, size_t from, size_t to);
  double MedianLog(const RegressionState& st, size_t from, size_t to);

  std::vector<double> scratch_;
  std::vector<double> scratch2_;
};

}  // namespace stepwatch::analysis
