// Pipeline imbalance: with pp_stage, the slowest stage's busy time against the other stages'.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/registry.h"
#include "analysis/ring.h"

namespace stepwatch::analysis {

class PipelineState : public DetectorState {
 public:
  struct Stage {
    Ring<float> medians;  // per step, the median busy time of the stage's ranks
    double sum = 0;
  };
  std::map<int, Stage> stages;
  bool imbalanced = false;
  int stage = -1;  // the slowest stage
  double ratio = 0;
  double stage_s = 0;
  double others_s = 0;
  int64_t since_step = 0;
  int64_t since_nanos = 0;
};

class PipelineDetector : public Detector {
 public:
  const char* name() const override { return "pipeline"; }
  unsigned hooks() const override { return kStep | kEvaluate; }
  std::unique_ptr<DetectorState> NewJobState(const EngineOptions& options,
                                             int world_size) const override;
  void OnStep(const JobView& view, const StepView& step, DetectorState* state) override;
  void Evaluate(const JobView& view, const DetectorState* state,
                std::vector<Finding>* job_findings) const override;
  // The ranks of the slowest stage count as stragglers while the finding holds.
  void AnnotateRank(const JobView& view, const DetectorState* state, int rank,
                    RankSnapshot* out) const override;
};

}  // namespace stepwatch::analysis
