// Underutilized and idle GPUs: SM activity (else utilization) under the threshold in every
// reading for the window; a GPU of a job is underutilized, one with no process idle.
#pragma once

#include <memory>
#include <vector>

#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/registry.h"

namespace stepwatch::analysis {

class GpuUtilizationState : public DetectorState {
 public:
  int64_t below_since = -1;  // first reading of the current run under the threshold
  bool flagged = false;
  int64_t flagged_since_nanos = 0;
  int64_t since_step = 0;  // the owner job's step when the run began
};

class GpuUtilizationDetector : public Detector {
 public:
  const char* name() const override { return "gpu_utilization"; }
  unsigned hooks() const override { return kGpu; }
  std::unique_ptr<DetectorState> NewGpuState() const override;
  void OnGpu(const EngineView& view, const GpuInfo& g, DetectorState* state) override;
  void OnAdvanceGpu(const EngineView& view, const GpuInfo& g, int64_t now,
                    DetectorState* state) override;
  void OnGpuReleased(const EngineView& view, const GpuInfo& g, DetectorState* state) override;
  void EvaluateGpu(const EngineView& view, const GpuInfo& g, const DetectorState* state,
                   std::vector<Finding>* out) const override;

 private:
  static Cause Attribute(const EngineView& view, const GpuInfo& g, Evidence* e,
                         DeviceEvidence* dev);
};

}  // namespace stepwatch::analysis
