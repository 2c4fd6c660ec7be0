// The detector list: the one place that says which detectors run and in what order.
//
// Order matters. On each completed step the detectors run in this order, so a detector may read
// the state of one listed before it (slow_node reads the straggler flags of this step). Findings
// are collected per job in this order too, and a detector may rework the job's findings so far
// (slow_node replaces the straggler findings of a slow node's ranks).
#include "analysis/detector.h"
#include "analysis/detectors/gpu_utilization.h"
#include "analysis/detectors/health.h"
#include "analysis/detectors/pipeline.h"
#include "analysis/detectors/regression.h"
#include "analysis/detectors/scaling.h"
#include "analysis/detectors/slow_node.h"
#include "analysis/detectors/stall.h"
#include "analysis/detectors/straggler.h"

namespace stepwatch::analysis {

std::vector<std::unique_ptr<Detector>> MakeDetectors() {
  std::vector<std::unique_ptr<Detector>> list;
  auto straggler = std::make_unique<StragglerDetector>();
  const StragglerDetector* flags = straggler.get();
  list.push_back(std::move(straggler));
  list.push_back(std::make_unique<SlowNodeDetector>(flags));
  list.push_back(std::make_unique<PipelineDetector>());
  list.push_back(std::make_unique<ScalingDetector>());
  list.push_back(std::make_unique<RegressionDetector>());
  list.push_back(std::make_unique<StallDetector>());
  list.push_back(std::make_unique<GpuUtilizationDetector>());
  list.push_back(std::make_unique<GpuHealthDetector>());
  list.push_back(std::make_unique<NicHealthDetector>());
  for (size_t i = 0; i < list.size(); ++i) list[i]->set_slot(i);
  return list;
}

}  // namespace stepwatch::analysis
