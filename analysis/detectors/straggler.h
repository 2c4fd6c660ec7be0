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

// The sequential test of one series (busy time, or one named section) of one rank.
struct SeriesTest {
  static constexpr int kBank = 5;
  // Temporal noise of the relative excess, exponentially weighted, from differences of steps one
  // apart (over tens of steps, and over the last few: a job whose noise grows at once, as when a
  // long data wait that dominated the step ends, must not be judged by the older, smaller noise)
  // and kNoiseLag apart; the last kNoiseLag excesses (by observed % kNoiseLag).
  static constexpr int32_t kNoiseLag = 8;
  float var = 0, var_recent = 0, var_lagged = 0;
  std::array<float, kNoiseLag> recent{};
  float Noise() const { return std::sqrt(std::max({var, var_recent, var_lagged})); }
  int32_t observed = 0;
  // Long-memory mean of the series against the median of all peers: how the split into a fast and
  // a slow cluster sees the rank.
  float level = 0;
  int32_t level_steps = 0;
  std::array<float, kBank> cusum{};
  // Since each statistic last stood at zero: summed relative and absolute excess, steps, start.
  std::array<float, kBank> sum_rel{};
  std::array<float, kBank> sum_abs{};
  std::array<int32_t, kBank> count{};
  std::array<int64_t, kBank> start_step{};
  std::array<int64_t, kBank> start_nanos{};
  int64_t tested_from = -1;  // the first step tested (after the warm-up)
  // While flagged: the clearing statistic and the mean excess since the change point.
  bool flagged = false;
  float clear = 0;
  double effect_sum = 0;
  int64_t effect_steps = 0;
  float flagged_effect = 0;  // the mean excess since the change point when it was flagged
  int64_t since_step = 0;
  int64_t since_nanos = 0;

  double Effect() const { return effect_steps > 0 ? effect_sum / effect_steps : 0; }
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
    double scale = 0;  // the peers' median busy time then
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

// What every test of one peer group shares in one step: the thresholds and, from the peers'
// noise, each statistic's increment per unit of excess, its drift and its clipping bounds.
struct TestRound {
  TestRound(double sigma, double min_effect, double h, double h_clear, double abs_floor,
            int64_t step, int64_t nanos);
  double min_effect, h, h_clear, abs_floor;
  int64_t step, nanos;
  double sigma = 0, sigma2 = 0;
  // The bank's statistics.
  std::array<double, SeriesTest::kBank> coef, half, lo, hi;
};

// Updates `t` with one step's relative excess `rel` (and `abs` seconds) over a reference that
// includes the series itself with weight 1 / c (`self` = c / (c - 1) turns the excess into the one
// over the others, for the effect's size; 1 when the reference leaves it out); true when its flag
// changed. Exposed for tests of the statistics alone.
bool UpdateSeriesTest(double rel, double abs, double self, const TestRound& round, SeriesTest* t);
// Whether the series' evidence of a slowdown of at least `min_effect` is half-way to the flag
// threshold `h`, or flagged: such a rank is left out of the reference (a quarter at most).
bool IsSuspect(const SeriesTest& t, double h, double min_effect);
// Folds one step's relative excess into the series' own noise estimate.
void ObserveNoise(double rel, SeriesTest* t);

}  // namespace stepwatch::analysis
