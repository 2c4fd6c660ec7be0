// Regressions: change-point detection on the job's step time, the median of the recent window
// against a reference level before it (frozen while flagged).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/detector.h"
#include "analysis/ring.h"

namespace stepwatch::analysis {

class RegressionState : public DetectorState {
 public:
  RegressionState(int window, int reference) : recent(window), reference(reference) {}
  Ring<std::pair<int64_t, float>> recent;  // (step, step time)
  Ring<float> reference;
  bool regressed = false;
  int64_t since_step = 0;
  int64_t since_nanos = 0;
  double baseline = 0;
  double level = 0;
  // What rose with the step time, fixed when the regression is found.
  // and by how much per step (unset when the split does not say).
  Cause cause = Cause::kUnknown;
  std::optional<double> rise_seconds;
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
  std::vector<double> scratch_;
};

}  // namespace stepwatch::analysis
