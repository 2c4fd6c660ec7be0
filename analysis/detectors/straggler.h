// Stragglers: a rank busier than its peers (the same pipeline stage and tensor rank, or the whole
// job), in its busy time or in one named section, judged by sequential tests whose evidence
// accumulates with the steps observed.
//
// Each step, every rank's relative excess x = value / reference - 1 is scored, where the
// reference is the mean of the healthy peers: the central part of the fast cluster when the
// peers' levels split into two clearly separated groups (so that up to half of them may be slow
// together), less the suspects. x feeds a bank of CUSUM statistics, one per assumed effect d (1,
// 2, 4, 8, 16 x the minimum effect): each adds d / sigma^2 x (x - d / 2) per step, the
// log-likelihood ratio of "d slower" against "as fast as the peers" under Gaussian noise of sigma,
// the median over peers of each rank's own noise. The bank is within about 10% of the test tuned to
// the true effect, whatever it is, so the steps to detection scale with (noise / effect)^2. Wald's
// bound keeps the rate of false crossings under exp(-h) per statistic and step: h = log(peers x
// series x bank / false_alarm_per_step) holds the job's false flags per step under the budget
// however many ranks it has. One step adds at most h / 2, so no single outlier flags a rank. The
// change point is the step after the crossing statistic last stood at zero.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "analysis/detector.h"
#include "analysis/detectors/straggler_statistics.h"
#include "analysis/engine.h"
#include "analysis/registry.h"
#include "analysis/ring.h"
#include "analysis/window.h"

namespace stepwatch::analysis {

// One step's comparison of a rank's busy time with its peers' reference (the finding's evidence).
struct Score {
  int64_t step = 0;
  float busy = 0, ref = 0;
  float compute = 0, ref_compute = 0;
  float data = 0, ref_data = 0;
  bool split = false;
};

// One rank's tests and recent scores.
struct RankScores {
  Ring<Score> scores;
  double sum_ratio = 0;  // of busy / ref over `scores`
  SeriesTest busy;
  // By the job's section index; empty until the rank reports a section.
  std::vector<SeriesTest> sections;
  bool flagged = false;
  int64_t flagged_since_step = 0;
  int64_t flagged_since_nanos = 0;
  int64_t flagged_steps = 0;

  // Mean busy / reference over the recent scores (0 without scores).
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
    if (static_cast<size_t>(rank) >= ranks_.size()) return;
    ranks_[rank].reset();
    exclusion_[rank] = 0;
  }

  // Why a rank is left out of its peers' reference, by rank (dense: read for every peer each
  // step): in the slow cluster or an outlier of the fast one at the group's last split, or a
  // suspect at its last step (evidence of a slowdown half-way to a flag).
  static constexpr uint8_t kSlowCluster = 1, kOutlier = 2, kSuspect = 4;
  uint8_t Exclusion(int rank) const {
    return static_cast<size_t>(rank) < exclusion_.size() ? exclusion_[rank] : 0;
  }
  void SetExclusion(int rank, uint8_t bits) {
    if (static_cast<size_t>(rank) < exclusion_.size()) exclusion_[rank] = bits;
  }

  // Some rank's flag changed in the last step.
  bool flags_changed = false;

  // What a peer group recomputes every few steps only (both change slowly): the split of its
  // busy levels into a fast and a slow cluster, and its busy noise.
  struct Group {
    int64_t refreshed_step = INT64_MIN;
    size_t peers = 0;
    bool split = false;
    double sigma = -1;
    double scale = 0;  // the peers' median busy time then (smoothed)
    // The peers' median busy time, smoothed over a few steps: one step's median of a small group
    // varies as much as its ranks do (20-30% for 2 ms steps of a real job on a busy host).
    double median_smoothed = 0;
    // The group's noise as last measured (kept across a rescale): how far the smoothed median may
    // wander within one regime.
    double last_sigma = -1;
    // The median over the peers of their busy time's outlier rate (SeriesTest::spike_rate).
    double spike_rate = 0;
    // Squared spread across the healthy peers, summed over the steps since the group started or
    // was rescaled (the noise until the ranks' own is known).
    double spread_sum = 0;
    int spread_steps = 0;
  };
  Group& GroupOf(int64_t group) { return groups_[group]; }

 private:
  // By rank, up to the highest rank scored: a sample claiming a huge world size costs nothing
  // here until its ranks report full steps.
  std::vector<std::unique_ptr<RankScores>> ranks_;
  std::vector<uint8_t> exclusion_;
  std::map<int64_t, Group> groups_;
};

// A rank's split against its peers over the recent scores: busy and compute vs the reference, and
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
  // What the tests of one step of one peer group share.
  struct Round {
    int64_t step = 0;
    int64_t nanos = 0;
    double h = 0;          // flag threshold
    double h_clear = 0;    // clear threshold
    double abs_floor = 0;  // seconds
    double step_cap = 0;   // the most one step adds to a statistic (OutlierStepCap)
  };
  void ScoreGroup(const JobView& view, const StepView& step, size_t begin, size_t end,
                  StragglerState& st);
  // Splits the peers' busy levels into a fast and a slow cluster when they are clearly separate,
  // and marks the fast cluster's outliers (StragglerState::Exclusion); false without a split.
  bool SplitLevels(const std::vector<Entry>& es, StragglerState& st, double min_effect);
  // Marks in healthy_ (by position in peers_) the peers that form the reference.
  void ChooseHealthy(const std::vector<Entry>& es, const StragglerState& st);
  // The rank's flag from its series' (busy time and sections).
  static void UpdateRankFlag(RankScores* r, StragglerState* st);
  void ScoreSections(const JobView& view, const std::vector<Entry>& es,
                     const std::vector<EntrySection>& values_of, const Round& round,
                     StragglerState& st);
  static void Attribute(const JobView& view, int rank, const RankScores& r, const GpuInfo* g,
                        Finding* f);

  std::vector<double> scratch_;
  std::vector<size_t> peers_;
  std::vector<char> healthy_;
  std::vector<std::pair<float, size_t>> levels_;
  std::vector<double> prefix_, prefix_sq_;
  struct SectionValue {
    RankScores* rank;
    float seconds;
  };
  std::vector<std::vector<SectionValue>> by_section_;
  std::vector<char> in_reference_;  // by position in one section's values
  std::vector<RankScores*> scored_;
};

}  // namespace stepwatch::analysis
