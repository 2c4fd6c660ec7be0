// The sequential statistics behind the straggler detector (straggler.h): one series' noise
// estimate, its bank of CUSUM tests against a reference, and when it is flagged, suspect or
// cleared. Pure functions of their arguments, tested alone (straggler_statistics_test.cc).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "analysis/stats.h"

namespace stepwatch::analysis {

// Steps of a series' own noise before its tests start (the noise scales every increment).
inline constexpr int32_t kWarmupSteps = 8;
// A flag needs a mean excess since the change point of at least this share of the minimum effect:
// a persistent difference well under it (uneven shards within noise) is not a straggler.
inline constexpr double kMinEffectShare = 1.0;

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
  // Share of recent steps whose change was an outlier (clipped at kClipSigmas deviations): a
  // rank descheduled now and then on a busy host. Bounds the evidence one step may add.
  float spike_rate = 0;
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

// What every test of one peer group shares in one step: the thresholds and, from the peers'
// noise, each statistic's increment per unit of excess, its drift and its clipping bounds.
struct TestRound {
  TestRound(double sigma, double min_effect, double h, double h_clear, double abs_floor,
            int64_t step, int64_t nanos);
  double min_effect, h, h_clear, abs_floor;
  int64_t step, nanos;
  double sigma = 0, sigma2 = 0;
  // The most one step may add to a statistic: h / 2 (no single outlier flags a rank), less where
  // outliers are common (OutlierStepCap).
  double step_cap = 0;
  // The bank's statistics.
  std::array<double, SeriesTest::kBank> coef, half, lo, hi;
};

// The most evidence one step may add when a share `spike_rate` of steps are outliers: about
// log(1 / spike_rate), the rarity of an outlier, between h / 8 and h / 2. With Gaussian noise
// (outliers rarer than exp(-h / 2)) two slow steps can flag a rank; where a busy host deschedules
// ranks for a step or two every few hundred steps, a burst of two or three no longer does, while
// a rank that stays slower still crosses within h / log(1 / spike_rate) steps.
double OutlierStepCap(double h, double spike_rate);

// Updates `t` with one step's relative excess `rel` (and `abs` seconds) over a reference that
// includes the series itself with weight 1 / c (`self` = c / (c - 1) turns the excess into the one
// over the others, for the effect's size; 1 when the reference leaves it out); true when its flag
// changed. Exposed for tests of the statistics alone.
bool UpdateSeriesForTest(double rel, double abs, double self, const TestRound& round,
                         SeriesTest* t);
// Whether the series' evidence of a slowdown of at least `min_effect` is half-way to the flag
// threshold `h`, or flagged: such a rank is left out of the reference (a quarter at most).
bool IsSuspect(const SeriesTest& t, double h, double min_effect);
// Folds one step's relative excess into the series' own noise estimate.
void ObserveNoise(double rel, SeriesTest* t);

// Steps of its own noise a series needs before PeerNoise counts it in a group of three or more:
// the median over the peers holds up against a few poor early estimates, so a new job's tests
// (named sections are measured every step) start after half the warm-up. A pair's "median" is
// the mean of the two, so each needs the full warm-up. Measured on the detection grid: 860 of 880
// cells at least as good as both peers (858 with the full warm-up), still no false flag in the
// healthy runs.
inline constexpr int32_t kPeerWarmupSteps = kWarmupSteps / 2;

// The median over `count` tests (those past their warm-up; `get(i)` may be null) of each one's own
// noise; -1 while fewer than half of them are past it.
template <typename Get>
double PeerNoise(size_t count, Get get, std::vector<double>* scratch) {
  const int32_t warmup = count >= 3 ? kPeerWarmupSteps : kWarmupSteps;
  scratch->clear();
  for (size_t i = 0; i < count; ++i) {
    const SeriesTest* t = get(i);
    if (t != nullptr && t->observed >= warmup) scratch->push_back(t->Noise());
  }
  if (scratch->empty() || 2 * scratch->size() < count) return -1;
  return MedianInPlace(*scratch);
}

}  // namespace stepwatch::analysis
