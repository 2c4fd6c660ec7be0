// Hardware health findings: a GPU with faults (gpu_health) and a node's network port with faults
// (nic_health), as the registry's trackers judged the last readings (analysis/health_tracker.h).
// One finding per GPU and per port, its cause the most severe fault; each names the jobs with
// ranks on the node (at risk) and stays while the fault does, whether or not a job runs there.
#pragma once

#include <string>
#include <vector>

#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/registry.h"

namespace stepwatch::analysis {

class GpuHealthDetector : public Detector {
 public:
  const char* name() const override { return "gpu_health"; }
  unsigned hooks() const override { return kGpu; }
  void EvaluateGpu(const EngineView& view, const GpuInfo& g, const DetectorState* state,
                   std::vector<Finding>* out) const override;
};

class NicHealthDetector : public Detector {
 public:
  const char* name() const override { return "nic_health"; }
  unsigned hooks() const override { return kHost; }
  void EvaluateHost(const EngineView& view, const std::string& node, const HostInfo& host,
                    std::vector<Finding>* out) const override;
};

// The jobs with ranks on `node`, sorted, the first few.
std::vector<std::string> JobsOnNode(const Registry& registry, const std::string& node);

}  // namespace stepwatch::analysis
