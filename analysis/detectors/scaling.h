// Scaling efficiency: per-GPU throughput at the job's world size against the best seen at a
// smaller size of the same job name (the history outlives jobs and, serialised, restarts).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "analysis/detector.h"
#include "analysis/engine.h"
#include "analysis/registry.h"

namespace stepwatch::analysis {

class ScalingState : public DetectorState {
 public:
  std::optional<double> ratio;  // per-GPU throughput / the best at a smaller size
  int reference_size = 0;
  int64_t since_step = 0;
  int64_t since_nanos = 0;
};

class ScalingDetector : public Detector {
 public:
  const char* name() const override { return "scaling"; }
  unsigned hooks() const override { return kStep | kEvaluate; }
  std::unique_ptr<DetectorState> NewJobState(const EngineOptions& options,
                                             int world_size) const override;
  void OnStep(const JobView& view, const StepView& step, DetectorState* state) override;
  void Evaluate(const JobView& view, const DetectorState* state,
                std::vector<Finding>* job_findings) const override;
  void AnnotateJob(const JobView& view, const DetectorState* state,
                   JobSnapshot* out) const override;

  // "stepwatch-scaling-history v1", then one line per job name and size: escaped name, size,
  // best per-GPU throughput.
  std::string SerializeHistory() const;
  // Merges a serialised history (keeping the better figure of each size); nothing on error.
  absl::Status LoadHistory(absl::string_view data);

 private:
  struct JobHistory {
    std::map<int, double> per_gpu;  // world size -> best per-GPU rate
    uint64_t last_update = 0;       // of update_clock_, for eviction
  };
  // The history of `job`, created (evicting the least recently updated name when `max_jobs` are
  // held) if absent.
  JobHistory& HistoryOf(const std::string& job, int max_jobs);

  std::map<std::string, JobHistory> history_;
  uint64_t update_clock_ = 0;
  std::vector<double> scratch_;
};

}  // namespace stepwatch::analysis
