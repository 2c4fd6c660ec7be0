#include "analysis/detectors/straggler_statistics.h"

namespace stepwatch::analysis {
namespace {

// Weights of the newest step in the noise estimates: they follow the job within tens of steps.
constexpr float kNoiseMemory = 1.0f / 32;
constexpr float kRecentNoiseMemory = 1.0f / 8;
// A step's excess counts at most this many standard deviations beyond the tested effect.
constexpr double kClipSigmas = 4;
// Weight of the newest step in a series' outlier rate.
constexpr float kSpikeMemory = 1.0f / 64;

double Clamp(double x, double lo, double hi) { return std::min(std::max(x, lo), hi); }

}  // namespace

void ObserveNoise(double rel, SeriesTest* t) {
  // Half the mean squared difference of steps one apart, and of steps kNoiseLag apart: the noise
  // of the series without its level, so a rank that slows down or recovers does not look noisy
  // for the tens of steps an average of its deviations would take to follow; the lagged one also
  // holds the slow wander of real jobs (shared file systems, neighbours), which a test tuned to
  // step-to-step noise alone would take for a slowdown.
  if (t->observed < INT32_MAX) ++t->observed;
  const size_t slot = t->observed % SeriesTest::kNoiseLag;  // the value kNoiseLag steps ago
  if (t->observed > 1) {
    const double bound =
        t->observed > kWarmupSteps && t->var > 0 ? kClipSigmas * std::sqrt(2.0) * t->Noise() : 0;
    // One outlier step (a pause, a checkpoint) must not inflate the noise for tens of steps.
    auto clip = [&](double d) { return bound > 0 ? Clamp(d, -bound, bound) : d; };
    const double raw = rel - t->recent[(t->observed - 1) % SeriesTest::kNoiseLag];
    const double d = clip(raw);
    if (bound > 0) {
      const float spike = std::fabs(raw) > bound ? 1.0f : 0.0f;
      t->spike_rate += kSpikeMemory * (spike - t->spike_rate);
    }
    const double a = std::max(1.0 / (t->observed - 1), static_cast<double>(kNoiseMemory));
    const double b = std::max(1.0 / (t->observed - 1), static_cast<double>(kRecentNoiseMemory));
    t->var = static_cast<float>((1 - a) * t->var + a * d * d / 2);
    t->var_recent = static_cast<float>((1 - b) * t->var_recent + b * d * d / 2);
    if (t->observed > SeriesTest::kNoiseLag) {
      const double dl = clip(rel - t->recent[slot]);
      const int64_t lagged = t->observed - SeriesTest::kNoiseLag;
      const double c = std::max(1.0 / lagged, static_cast<double>(kNoiseMemory));
      t->var_lagged = static_cast<float>((1 - c) * t->var_lagged + c * dl * dl / 2);
    }
  }
  t->recent[slot] = static_cast<float>(rel);
}

TestRound::TestRound(double sigma, double min_effect_in, double h_in, double h_clear_in,
                     double abs_floor_in, int64_t step_in, int64_t nanos_in)
    : min_effect(min_effect_in),
      h(h_in),
      h_clear(h_clear_in),
      abs_floor(abs_floor_in),
      step(step_in),
      nanos(nanos_in) {
  const double s2 = sigma * sigma;
  step_cap = h / 2;
  this->sigma = sigma;
  sigma2 = s2;
  for (int j = 0; j < SeriesTest::kBank; ++j) {
    const double d = min_effect * (1 << j);
    coef[j] = d / s2;
    half[j] = d / 2;
    lo[j] = -kClipSigmas * sigma - d;
    hi[j] = d + kClipSigmas * sigma;
  }
}

bool UpdateSeriesForTest(double rel, double abs, double self, const TestRound& round,
                         SeriesTest* t) {
  if (t->tested_from < 0) t->tested_from = round.step;
  // Two full steps reach the threshold (float sums must not fall short of it by a rounding).
  const double cap = round.step_cap * (1 + 1e-6);
  for (int j = 0; j < SeriesTest::kBank; ++j) {
    const double x = Clamp(rel, round.lo[j], round.hi[j]);
    const double inc = std::min(round.coef[j] * (x - round.half[j]), cap);
    if (t->cusum[j] <= 0) {
      if (inc <= 0) continue;
      t->start_step[j] = round.step;
      t->start_nanos[j] = round.nanos;
      t->sum_rel[j] = t->sum_abs[j] = 0;
      t->count[j] = 0;
    }
    t->cusum[j] = static_cast<float>(std::max(0.0, t->cusum[j] + inc));
    if (t->cusum[j] > 0) {
      t->sum_rel[j] += static_cast<float>(self * rel);
      t->sum_abs[j] += static_cast<float>(self * abs);
      ++t->count[j];
    } else {
      t->count[j] = 0;
    }
  }
  if (!t->flagged) {
    int best = -1;
    for (int j = 0; j < SeriesTest::kBank; ++j) {
      if (t->cusum[j] < round.h || t->count[j] < 2) continue;
      if (t->sum_rel[j] / t->count[j] < kMinEffectShare * round.min_effect) continue;
      if (t->sum_abs[j] / t->count[j] < round.abs_floor) continue;
      // The earliest change point among the tests that hold.
      if (best < 0 || t->start_step[j] < t->start_step[best]) best = j;
    }
    if (best < 0) return false;
    t->flagged = true;
    t->clear = 0;
    t->since_step = t->start_step[best];
    t->since_nanos = t->start_nanos[best];
    t->effect_sum = t->sum_rel[best];
    t->effect_steps = t->count[best];
    t->flagged_effect = static_cast<float>(t->Effect());
    return true;
  }
  t->effect_sum += self * rel;
  ++t->effect_steps;
  // "Back among its peers" (mean 0) against "still slower by half the effect it was flagged
  // with" (at least the minimum effect): a burst of slow steps clears in about as many steps as
  // it took to flag, a rank still the minimum effect slower stays flagged.
  const double d = std::max(round.min_effect, t->flagged_effect / 2.0);
  const double x = Clamp(rel, -kClipSigmas * round.sigma - d, d + kClipSigmas * round.sigma);
  const double inc = std::min(d / round.sigma2 * (d / 2 - x), round.h_clear / 2);
  t->clear = static_cast<float>(std::max(0.0, t->clear + inc));
  if (t->clear < round.h_clear) return false;
  t->flagged = false;
  t->clear = 0;
  t->cusum.fill(0);
  t->count.fill(0);
  t->effect_sum = 0;
  t->effect_steps = 0;
  return true;
}

double OutlierStepCap(double h, double spike_rate) {
  if (spike_rate <= 0) return h / 2;
  return Clamp(std::log(1 / spike_rate), h / 8, h / 2);
}

bool IsSuspect(const SeriesTest& t, double h, double min_effect) {
  if (t.flagged && t.Effect() >= min_effect) return true;
  for (int j = 0; j < SeriesTest::kBank; ++j) {
    if (t.cusum[j] >= h / 2 && t.sum_rel[j] >= min_effect * t.count[j]) return true;
  }
  return false;
}

}  // namespace stepwatch::analysis
