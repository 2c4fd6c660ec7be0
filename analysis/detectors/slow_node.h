// Slow nodes: every rank (2 or more) of one node flagged as a straggler, the node holding under
// half the job. One node finding replaces the straggler findings of its ranks.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/registry.h"

namespace stepwatch::analysis {

class StragglerDetector;

class SlowNodeState : public DetectorState {
 public:
  struct NodeSlow {
    int64_t since_step = 0;
    int64_t since_nanos = 0;
    int64_t under_half_since = -1;  // step when fewer than half its ranks stayed flagged
  };
  std::map<std::string, NodeSlow> nodes;
};

class SlowNodeDetector : public Detector {
 public:
  // Reads the straggler flags kept by `straggler`, which runs before it.
  explicit SlowNodeDetector(const StragglerDetector* straggler) : straggler_(straggler) {}
  const char* name() const override { return "slow_node"; }
  unsigned hooks() const override { return kStep | kEvaluate; }
  std::unique_ptr<DetectorState> NewJobState(const EngineOptions& options,
                                             int world_size) const override;
  void OnStep(const JobView& view, const StepView& step, DetectorState* state) override;
  // Removes the straggler findings of ranks on a slow node and puts the node findings first.
  void Evaluate(const JobView& view, const DetectorState* state,
                std::vector<Finding>* job_findings) const override;

 private:
  Finding NodeFinding(const JobView& view, const std::string& node,
                      const SlowNodeState::NodeSlow& st) const;

  const StragglerDetector* straggler_;
};

}  // namespace stepwatch::analysis
