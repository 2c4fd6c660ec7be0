// The detector interface. A detector owns its state (per job, and engine-wide where it watches
// GPUs rather than jobs), updates it from read-only views of the step window and the registry,
// and emits structured findings. The engine calls the detectors in the order of the list in
// analysis/detectors/detectors.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "analysis/registry.h"
#include "analysis/window.h"

namespace stepwatch::analysis {

// What a detector sees of one job: the job (ranks, window), the registry and the options.
struct JobView {
  const JobRecord& job;
  const Registry& registry;
  const EngineOptions& options;

  // The state another detector keeps for this job (null when it keeps none).
  template <typename T>
  const T* StateOf(size_t slot) const {
    return static_cast<const T*>(job.states[slot].get());
  }
};

// What a detector sees of the registry alone (engine-wide detectors).
struct EngineView {
  const Registry& registry;
  const EngineOptions& options;
};

// One complete step: entries sorted by (peer group, rank); `step_seconds` is the median step time.
struct StepView {
  int64_t step = 0;
  int64_t nanos = 0;
  double step_seconds = 0;
  const std::vector<Entry>& entries;
  // The entries' named sections (Entry::sections_begin); null when none reported any.
  const std::vector<EntrySection>* sections = nullptr;
};

class Detector {
 public:
  // The groups of calls below that a detector implements (hooks()): the engine calls and times
  // only those.
  enum Hook : unsigned {
    kStep = 1,      // OnStep
    kAdvance = 2,   // OnAdvance
    kEvaluate = 4,  // Evaluate
    kGpu = 8,       // OnGpu, OnAdvanceGpu, OnGpuReleased, EvaluateGpu
    kHost = 16,     // EvaluateHost
  };

  virtual ~Detector() = default;
  // Short and stable: used as the key of DetectorTimings().
  virtual const char* name() const = 0;
  virtual unsigned hooks() const = 0;

  // The detector's position in the list, set by the engine: the slot of its state in each job
  // and GPU.
  void set_slot(size_t slot) { slot_ = slot; }
  size_t slot() const { return slot_; }

  // Per-job parts. Fresh state for a (new, reset or rescaled) job; null when none is kept.
  virtual std::unique_ptr<DetectorState> NewJobState(const EngineOptions& /*options*/,
                                                     int /*world_size*/) const {
    return nullptr;
  }
  // A step of the job completed (the detectors run in list order).
  virtual void OnStep(const JobView&, const StepView&, DetectorState*) {}
  // Time passed (Engine::Advance), after the job's pending steps were completed.
  virtual void OnAdvance(const JobView&, int64_t /*now*/, DetectorState*) {}
  // Appends the job's active findings to `job_findings` (the job's findings so far, from the
  // detectors before this one in the list).
  virtual void Evaluate(const JobView&, const DetectorState*,
                        std::vector<Finding>* /*job_findings*/) const {}
  // A rank was forgotten (its node was removed); it starts afresh if it reports again.
  virtual void OnRankRemoved(const JobView&, int /*rank*/, DetectorState*) {}
  // Fills in the detector's part of a rank's or a job's snapshot.
  virtual void AnnotateRank(const JobView&, const DetectorState*, int /*rank*/,
                            RankSnapshot*) const {}
  virtual void AnnotateJob(const JobView&, const DetectorState*, JobSnapshot*) const {}

  // Per-GPU parts (a GPU is not owned by one job; its state goes with its node). Fresh state for
  // a GPU's first reading; null when none is kept.
  virtual std::unique_ptr<DetectorState> NewGpuState() const { return nullptr; }
  // A reading arrived (the registry has resolved the rank that drives the GPU).
  virtual void OnGpu(const EngineView&, const GpuInfo&, DetectorState*) {}
  virtual void OnAdvanceGpu(const EngineView&, const GpuInfo&, int64_t /*now*/, DetectorState*) {}
  // The job that drove the GPU is being removed (the GPU still names it).
  virtual void OnGpuReleased(const EngineView&, const GpuInfo&, DetectorState*) {}
  virtual void EvaluateGpu(const EngineView&, const GpuInfo&, const DetectorState*,
                           std::vector<Finding>* /*out*/) const {}

  // Per-host part: the findings about one node's host (its network ports).
  virtual void EvaluateHost(const EngineView&, const std::string& /*node*/, const HostInfo&,
                            std::vector<Finding>* /*out*/) const {}

 private:
  size_t slot_ = 0;
};

// The detectors, in the order the engine runs them (analysis/detectors/detectors.cc).
std::vector<std::unique_ptr<Detector>> MakeDetectors();

}  // namespace stepwatch::analysis
