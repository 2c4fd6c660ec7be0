// Stragglers: a rank busier than its peers (the same pipeline stage and tensor rank, or the whole
// job) over a window of steps, with noise-scaled margins and hysteresis.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "analysis/detector.h"
#include "analysis/ring.h"

namespace stepwatch::analysis {

// One step's comparison of a rank with its peers.
struct Score {
  int64_t step = 0;
  float busy = 0, ref = 0;
  float compute = 0, ref_compute = 0;
  float data = 0, ref_data = 0;
  float sigma = 0;  // robust relative noise of the peer group in this step
  bool over = false;
  bool split = false;
};

// One rank's scores over the window and its flag.
struct RankScores {
  Ring<Score> scores;
  double sum_ratio = 0;
  double sum_excess = 0;
  double sum_sigma = 0;
  double sum_ratio_sq = 0;
  int over_count = 0;
  bool flagged = false;
  int64_t flagged_since_step = 0;
  int64_t flagged_since_nanos = 0;
  int64_t flagged_steps = 0;

  // Mean busy / peers' busy over the window (0 without scores).
  double MeanRatio() const { return sum_ratio / std::max<size_t>(1, scores.size()); }
};

class StragglerState : public DetectorState {
 public:
  // Null while the rank has not been scored.
  const RankScores* Of(int rank) const {
    return static_cast<size_t>(rank) < ranks_.size() ? ranks_[rank].get() : nullptr;
  }
  RankScores& Mutable(int rank, int window);
  void Erase(int rank) {
    if (static_cast<size_t>(rank) < ranks_.size()) ranks_[rank].reset();
  }

  // Some rank's flag changed in the last step.
  bool flags_changed = false;

 private:
  // By rank, up to the highest rank scored: a sample claiming a huge world size costs nothing
  // here until its ranks report full steps.
  std::vector<std::unique_ptr<RankScores>> ranks_;
};

// A rank's split against its peers over the window: busy and compute vs the peers' median, and
// the data-loading excess per step where the excess lies in data loading rather than compute.
void SplitOf(const RankScores& r, Evidence* e);

class StragglerDetector : public Detector {
 public:
  const char* name() const override { return "straggler"; }
  unsigned hooks() const override { return kStep | kEvaluate; }
  std::unique_ptr<DetectorState> NewJobState(const EngineOptions& options,
                                             int world_size) const override;
  void OnStep(const JobView& view, const StepView& step, DetectorState* state) override;
  void OnRankRemoved(const JobView& view, int rank, DetectorState* state) override;
  void Evaluate(const JobView& view, const DetectorState* state,
                std::vector<Finding>* job_findings) const override;
  void AnnotateRank(const JobView& view, const DetectorState* state, int rank,
                    RankSnapshot* out) const override;

 private:
  void ScoreGroup(const JobView& view, const StepView& step, size_t begin, size_t end,
                  StragglerState& st);
  static void Evaluate(const EngineOptions& opt, RankScores& r, int64_t step, int64_t nanos,
                       double step_seconds);
  static void Attribute(const JobView& view, int rank, const RankScores& r, const GpuInfo* g,
                        Finding* f);

  std::vector<double> scratch_;
  std::vector<size_t> peers_;
};

}  // namespace stepwatch::analysis
