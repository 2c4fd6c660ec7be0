// Stalls: no new step for max(stall_multiple x median step, stall_floor); the ranks that exited
// tell a crash from a hang.
#pragma once

#include <memory>
#include <vector>

#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/registry.h"

namespace stepwatch::analysis {

class StallState : public DetectorState {
 public:
  // Stalled at job step `step`: holds until the job's newest step moves past it.
  bool stalled = false;
  int64_t step = -1;
  int64_t since_nanos = 0;
  int64_t limit_nanos = 0;
  double median_step_seconds = 0;  // when it stalled
  bool Active(const JobRecord& job) const { return stalled && job.max_step == step; }
};

class StallDetector : public Detector {
 public:
  const char* name() const override { return "stall"; }
  unsigned hooks() const override { return kAdvance | kEvaluate; }
  std::unique_ptr<DetectorState> NewJobState(const EngineOptions& options,
                                             int world_size) const override;
  void OnAdvance(const JobView& view, int64_t now, DetectorState* state) override;
  void Evaluate(const JobView& view, const DetectorState* state,
                std::vector<Finding>* job_findings) const override;

 private:
  std::vector<double> scratch_;
};

}  // namespace stepwatch::analysis
