// The straggler detector's scoring of one step (analysis/detectors/straggler.h): per peer group,
// the split of its ranks' levels into a fast and a slow cluster, the healthy reference and the
// group's noise, then each rank's busy time and named sections against the reference through the
// sequential tests, and the rank's flag from them. Findings are built in straggler.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "analysis/detector.h"
#include "analysis/detectors/straggler.h"
#include "analysis/detectors/straggler_statistics.h"
#include "analysis/engine.h"
#include "analysis/registry.h"
#include "analysis/ring.h"
#include "analysis/stats.h"
#include "analysis/window.h"
#include "common/check.h"

namespace stepwatch::analysis {
namespace {

// Weight of the newest step in the level the split reads: long enough to separate two clusters
// under heavy noise.
constexpr float kLevelMemory = 1.0f / 64;
// Two clusters of levels are separate when their means are this many within-cluster standard
// deviations apart (an evenly spread job splits in its middle at about 3.5).
constexpr double kClusterSeparation = 4.5;
// Steps between recomputations of a peer group's split and noise.
constexpr int64_t kRefreshSteps = 8;
// Peers needed to start from their spread before their own noise is known, and the margin on it.
constexpr size_t kMinSpreadPeers = 4;
constexpr double kSpreadInflation = 1.25;
// A median busy time that moved by more than this factor since is a new regime of noise.
constexpr double kRescaleRatio = 1.25;
// Weight of the newest step in the smoothed median busy time that a new regime is judged by, and
// how many of its standard deviations (from the group's noise) it may wander before it is one.
constexpr double kScaleMemory = 1.0 / 4;
constexpr double kScaleWanderSigmas = 3;

}  // namespace

// A test that held from its first step: the excess may have begun during the warm-up. The onset
// is then the first of the contiguous recent scores at least half the estimated effect over.
static void BackdateOnset(RankScores* r) {
  const double half = r->busy.Effect() / 2;
  for (size_t i = r->scores.size(); i-- > 0;) {
    const Score& s = r->scores[i];
    if (s.step > r->busy.since_step) continue;
    if (s.busy / s.ref - 1 < half) break;
    r->busy.since_step = s.step;
  }
}

bool StragglerDetector::SplitLevels(const std::vector<Entry>& es, StragglerState& st,
                                    double min_effect) {
  levels_.clear();
  for (size_t k = 0; k < peers_.size(); ++k) {
    const int rank = es[peers_[k]].rank;
    st.SetExclusion(rank, st.Exclusion(rank) & StragglerState::kSuspect);
    const RankScores* r = st.Of(rank);
    if (r != nullptr && r->busy.level_steps >= kWarmupSteps) levels_.push_back({r->busy.level, k});
  }
  const size_t m = levels_.size();
  if (m < 3) return false;
  std::sort(levels_.begin(), levels_.end());
  // Prefix sums of the sorted levels and their squares: any range's mean and spread in O(1).
  prefix_.assign(m + 1, 0);
  prefix_sq_.assign(m + 1, 0);
  for (size_t i = 0; i < m; ++i) {
    prefix_[i + 1] = prefix_[i] + levels_[i].first;
    prefix_sq_[i + 1] = prefix_sq_[i] + static_cast<double>(levels_[i].first) * levels_[i].first;
  }
  auto ss = [&](size_t b, size_t e) {  // sum of squared deviations over [b, e)
    const double sum = prefix_[e] - prefix_[b];
    return std::max(0.0, prefix_sq_[e] - prefix_sq_[b] - sum * sum / (e - b));
  };
  // The split of [0, end), keeping at least half of all levels in the lower (fast) cluster, that
  // separates the two clusters best (largest between-cluster variance), if they are separate
  // enough; 0 when none is. Applied again to the fast cluster while it splits, so that with three
  // classes of ranks the healthy group is the fastest, not the two fastest together.
  auto split = [&](size_t end) -> size_t {
    size_t best = 0;
    double best_between = -1;
    for (size_t j = (m + 1) / 2; j < end; ++j) {
      const double gap = (prefix_[end] - prefix_[j]) / (end - j) - prefix_[j] / j;
      const double between = static_cast<double>(j) * (end - j) * gap * gap;
      if (between > best_between) {
        best_between = between;
        best = j;
      }
    }
    if (best == 0 || end < 3) return 0;
    const double within = std::sqrt((ss(0, best) + ss(best, end)) / std::max<size_t>(1, end - 2));
    const double diff = (prefix_[end] - prefix_[best]) / (end - best) - prefix_[best] / best;
    if (diff < kMinEffectShare * min_effect || diff < kClusterSeparation * within) return 0;
    return best;
  };
  size_t fast = m;
  for (size_t j = split(m); j > 0; j = split(fast)) fast = j;
  for (size_t i = fast; i < m; ++i) {
    const int rank = es[peers_[levels_[i].second]].rank;
    st.SetExclusion(rank, st.Exclusion(rank) | StragglerState::kSlowCluster);
  }
  // Within the fast cluster, the reference is the mean of its central part: ranks more than the
  // minimum effect from its median level (persistently faster ones with less data, a rank
  // drifting up) would move a mean, while the mean of the central part keeps every exchangeable
  // rank's excess at mean 0 however skewed the noise. At least half of all levels stay in.
  const double centre = levels_[(fast - 1) / 2].first;
  size_t outliers = 0;
  for (size_t i = 0; i < fast; ++i) outliers += std::fabs(levels_[i].first - centre) > min_effect;
  if (2 * (fast - outliers) >= m) {
    for (size_t i = 0; i < fast; ++i) {
      if (std::fabs(levels_[i].first - centre) > min_effect) {
        const int rank = es[peers_[levels_[i].second]].rank;
        st.SetExclusion(rank, st.Exclusion(rank) | StragglerState::kOutlier);
      }
    }
  }
  return fast < m;
}

void StragglerDetector::ChooseHealthy(const std::vector<Entry>& es, const StragglerState& st) {
  // The fast cluster's central part (SplitLevels), less the suspects (IsSuspect, as of the last
  // step), at most a quarter of the peers, so that a slow minority does not drag the mean before
  // the levels show it. Leaving out every rank that gathers evidence would cascade: each one left
  // out lowers the reference until the next rank of an evenly spread job is over it; a quarter
  // cannot move the rest by more than the minimum effect requires.
  const size_t n = peers_.size();
  healthy_.assign(n, 1);
  size_t suspects = 0;
  for (size_t k = 0; k < n; ++k) {
    const uint8_t why = st.Exclusion(es[peers_[k]].rank);
    if (why & (StragglerState::kSlowCluster | StragglerState::kOutlier)) {
      healthy_[k] = 0;
    } else if ((why & StragglerState::kSuspect) && 4 * (suspects + 1) <= n) {
      healthy_[k] = 0;
      ++suspects;
    }
  }
}

namespace {

// The reference one peer group's ranks are scored against in one step (n >= 3; with two peers
// each rank is compared with the other instead).
struct PeerReference {
  double busy = 0, compute = 0, data = 0;
  // The slow cluster's median busy time when the peers split (0 otherwise). A rank of the fast
  // cluster holds the job back only once it is slower than that: it is tested against it.
  double slow = 0;
  double healthy_count = 0;  // peers in the reference
};

// What scoring each rank of one peer group in one step shares.
struct GroupStep {
  const EngineOptions& opt;
  int64_t step = 0;
  size_t peers = 0;
  double median_busy = 0;  // the median busy time of all the peers
  double h = 0;            // flag threshold
  double min_effect = 0;
  PeerReference ref;
  const TestRound* test = nullptr;  // null while the group's noise is not known
};

// Positions in `es` of the entries of [begin, end) that are evidence: ranks whose split is unknown
// (step time only) say nothing about who is slower; a stale or forgotten entry is no evidence
// either.
void CollectComparablePeers(const std::vector<Entry>& es, size_t begin, size_t end,
                            std::vector<size_t>* peers) {
  peers->clear();
  for (size_t i = begin; i < end; ++i) {
    if (!es[i].unknown_split && !es[i].stale && !es[i].forgotten && es[i].busy > 0) {
      peers->push_back(i);
    }
  }
}

// The log-likelihood a test must cross to flag: grows with the peers tested, the bank's tests and
// the series per rank (busy time and each section), so that false flags per group and step stay
// at straggler_false_alarm_per_step.
double FlagThreshold(size_t peers, size_t sections, const EngineOptions& opt) {
  return std::log(static_cast<double>(peers)) + std::log(1.0 / opt.straggler_false_alarm_per_step) +
         std::log(static_cast<double>(SeriesTest::kBank)) +
         std::log(1.0 + static_cast<double>(sections));
}

// Fills `ref` from the healthy peers (`healthy`, by position in `peers`); false when there is
// none.
bool HealthyReference(const std::vector<Entry>& es, const std::vector<size_t>& peers,
                      const std::vector<char>& healthy, bool split, std::vector<double>* scratch,
                      PeerReference* ref) {
  const size_t n = peers.size();
  // The healthy peers' mean, not their median (the split already left out the outliers of either
  // side): with it every healthy rank's excess has mean 0
  // (they sum to 0 each step) however skewed the noise is. Real steps have a heavy right tail
  // (a rank descheduled for a step takes 5x as long): against a median, which the tail does not
  // move, every rank would show a positive mean excess and, given enough steps, be flagged.
  double count = 0;
  for (size_t k = 0; k < n; ++k) {
    if (!healthy[k]) continue;
    const Entry& e = es[peers[k]];
    ref->busy += e.busy;
    ref->compute += e.compute;
    ref->data += e.data;
    ++count;
  }
  // A split keeps at least half of the peers; a release build still skips the group.
  SW_DCHECK(count > 0) << "no healthy peer among " << n;
  if (count == 0) return false;
  ref->busy /= count;
  ref->compute /= count;
  ref->data /= count;
  ref->healthy_count = count;
  if (split) {
    scratch->clear();
    for (size_t k = 0; k < n; ++k) {
      if (!healthy[k]) scratch->push_back(es[peers[k]].busy);
    }
    ref->slow = MedianInPlace(*scratch);
  }
  return true;
}

// Restarts the group's noise estimate after a change of the step's scale, or measures it anew
// from its ranks' own noise when it is due for a refresh.
void UpdateGroupNoise(bool rescaled, bool refresh, double median_busy, int64_t step,
                      const std::vector<Entry>& es, const std::vector<size_t>& peers,
                      const StragglerState& st, StragglerState::Group* group,
                      std::vector<double>* scratch) {
  const size_t n = peers.size();
  if (rescaled) {
    group->sigma = -1;
    group->refreshed_step = step;
    group->scale = median_busy;
    group->spread_sum = 0;
    group->spread_steps = 0;
  } else if (refresh) {
    group->sigma = PeerNoise(
        n,
        [&](size_t k) {
          const RankScores* r = st.Of(es[peers[k]].rank);
          return r == nullptr ? nullptr : &r->busy;
        },
        scratch);
    scratch->clear();
    for (size_t k = 0; k < n; ++k) {
      const RankScores* r = st.Of(es[peers[k]].rank);
      if (r != nullptr) scratch->push_back(r->busy.spike_rate);
    }
    group->spike_rate = scratch->empty() ? 0 : MedianInPlace(*scratch);
    group->refreshed_step = step;
    group->peers = n;
    group->scale = median_busy;
  }
}

// The group's relative noise for this step's tests; < 0 while it is not known yet.
double MeasuredSigma(const std::vector<Entry>& es, const std::vector<size_t>& peers,
                     const std::vector<char>& healthy, double ref_busy,
                     StragglerState::Group* group, std::vector<double>* scratch) {
  const size_t n = peers.size();
  double sigma_measured = group->sigma;
  if (sigma_measured < 0 && n >= kMinSpreadPeers) {
    // Until the ranks' own noise is known (a new job, or a new regime), the spread across the
    // healthy peers in the steps so far: it also holds their persistent differences, so it errs
    // on the side of fewer flags.
    scratch->clear();
    for (size_t k = 0; k < n; ++k) {
      if (healthy[k]) scratch->push_back(std::fabs(es[peers[k]].busy / ref_busy - 1));
    }
    const double spread = kMadToSigma * MedianInPlace(*scratch);
    group->spread_sum += spread * spread;
    ++group->spread_steps;
    if (group->spread_steps >= (n >= 2 * kMinSpreadPeers ? 2 : 4)) {
      sigma_measured = kSpreadInflation * std::sqrt(group->spread_sum / group->spread_steps);
    }
  }
  return sigma_measured;
}

// The rank's level against every peer, for the next split.
void UpdateBusyLevel(double busy, double median_busy, SeriesTest* t) {
  if (t->level_steps < INT32_MAX) ++t->level_steps;
  const double a = std::max(1.0 / t->level_steps, static_cast<double>(kLevelMemory));
  t->level += static_cast<float>(a * (busy / median_busy - 1 - t->level));
}

// Keeps the step's comparison of the rank with its reference among its recent scores.
void RecordScore(const Entry& e, int64_t step, double ref, double ref_compute, double ref_data,
                 RankScores* r) {
  Score sc;
  sc.step = step;
  sc.busy = static_cast<float>(e.busy);
  sc.ref = static_cast<float>(ref);
  sc.compute = static_cast<float>(e.compute);
  sc.ref_compute = static_cast<float>(ref_compute);
  sc.data = static_cast<float>(e.data);
  sc.ref_data = static_cast<float>(ref_data);
  sc.split = e.split;
  Score old;
  if (r->scores.Push(sc, &old)) r->sum_ratio -= old.busy / old.ref;
  r->sum_ratio += sc.busy / sc.ref;
}

// Scores one rank's busy time against its reference (`other`: the other rank of a group of two,
// else null) and updates its busy-time test and suspicion; null when it has no reference.
// `in_reference`: the rank is one of the healthy peers the reference is the mean of.
RankScores* ScoreRank(const GroupStep& g, const Entry& e, const Entry* other, bool in_reference,
                      StragglerState& st) {
  double rank_ref = g.ref.busy, rank_ref_compute = g.ref.compute, rank_ref_data = g.ref.data;
  bool waits_less = true;
  if (other != nullptr) {
    // No majority: compare with the other rank. The slower one is busier and waits less (the
    // faster one waits for it in the collective).
    rank_ref = other->busy;
    rank_ref_compute = other->compute;
    rank_ref_data = other->data;
    waits_less = e.wait < other->wait;
  }
  if (rank_ref <= 0) return nullptr;
  RankScores& r = st.Mutable(e.rank, g.opt.straggler_window);
  if (g.peers >= 3) UpdateBusyLevel(e.busy, g.median_busy, &r.busy);
  RecordScore(e, g.step, rank_ref, rank_ref_compute, rank_ref_data, &r);
  // A rank inside the reference pulls it towards itself: its excess over the other healthy
  // peers is c / (c - 1) times its excess over the mean of all c. The size of its slowdown (the
  // minimum effect a flag needs, the effect a finding reports) is read against the others;
  // without this one slow rank in four shows three quarters of its slowdown. The test itself
  // stays on the excess over all c, whose noise its peers share.
  const double c = g.ref.healthy_count;
  const double self = in_reference && c > 1 ? c / (c - 1) : 1.0;
  const double rel = e.busy / rank_ref - 1;
  // A rank of the fast cluster that is not flagged is tested against the slow cluster; a flagged
  // one clears once back among the healthy peers, wherever the split now puts it.
  const bool paced =
      g.ref.slow > 0 && !r.busy.flagged && !(st.Exclusion(e.rank) & StragglerState::kSlowCluster);
  const double paced_ref = paced ? g.ref.slow : rank_ref;
  const double paced_rel = e.busy / paced_ref - 1;
  const double abs = e.busy - paced_ref;
  if (g.test != nullptr) {
    // A busier rank that did not wait less is not the one the other waited for.
    const double tested = waits_less ? paced_rel : std::min(paced_rel, 0.0);
    const bool changed = UpdateSeriesForTest(tested, waits_less ? abs : std::min(abs, 0.0),
                                             paced ? 1.0 : self, *g.test, &r.busy);
    if (changed && r.busy.flagged && r.busy.since_step == r.busy.tested_from) BackdateOnset(&r);
  }
  ObserveNoise(rel, &r.busy);
  const uint8_t why = st.Exclusion(e.rank) & ~StragglerState::kSuspect;
  st.SetExclusion(e.rank,
                  IsSuspect(r.busy, g.h, g.min_effect) ? why | StragglerState::kSuspect : why);
  return &r;
}

}  // namespace

void StragglerDetector::ScoreGroup(const JobView& view, const StepView& step, size_t begin,
                                   size_t end, StragglerState& st) {
  const EngineOptions& opt = view.options;
  const std::vector<Entry>& es = step.entries;
  CollectComparablePeers(es, begin, end, &peers_);
  const size_t n = peers_.size();
  if (n < 2) return;  // nobody to compare with
  const double min_effect = opt.straggler_rel_margin;
  StragglerState::Group& group = st.GroupOf(es[begin].group);
  scratch_.clear();
  for (size_t i : peers_) scratch_.push_back(es[i].busy);
  const double all = MedianInPlace(scratch_);
  // When the step's scale changed at once (a long data wait that dominated the step ended), the
  // relative noise changed with it: the tests pause until the ranks' noise has been measured anew.
  // The change is judged on the smoothed median, against what the group's own noise lets it
  // wander: one step's median of a few noisy ranks (2-5 ms steps of a real 4-rank job on a busy
  // host) left a fixed band so often that the tests paused for hundreds of steps.
  group.median_smoothed = group.median_smoothed > 0
                              ? group.median_smoothed + kScaleMemory * (all - group.median_smoothed)
                              : all;
  const double wander = kScaleWanderSigmas * std::sqrt(kScaleMemory / (2 - kScaleMemory)) *
                        std::max(0.0, group.last_sigma);
  const double band = std::max(std::log(kRescaleRatio), wander);
  const bool rescaled =
      group.scale <= 0 || std::fabs(std::log(group.median_smoothed / group.scale)) > band;
  const bool refresh =
      !rescaled && (step.step - group.refreshed_step >= kRefreshSteps || group.peers != n);
  PeerReference ref;
  const size_t sections = view.job.section_names.size();
  const double h = FlagThreshold(n, sections, opt);
  if (n >= 3) {
    if (refresh) group.split = SplitLevels(es, st, min_effect);
    ChooseHealthy(es, st);
    if (!HealthyReference(es, peers_, healthy_, group.split, &scratch_, &ref)) return;
  }
  UpdateGroupNoise(rescaled, refresh, group.median_smoothed, step.step, es, peers_, st, &group,
                   &scratch_);
  const double sigma_measured = MeasuredSigma(es, peers_, healthy_, ref.busy, &group, &scratch_);
  if (sigma_measured >= 0) group.last_sigma = sigma_measured;
  Round round;
  round.step = step.step;
  round.nanos = step.nanos;
  round.h = h;
  round.h_clear = std::log(1.0 / opt.straggler_clear_false_alarm);
  round.abs_floor =
      std::max(opt.straggler_abs_margin_seconds, opt.straggler_step_fraction * step.step_seconds);
  std::optional<TestRound> test;
  if (sigma_measured >= 0) {
    test.emplace(std::max(sigma_measured, opt.straggler_noise_floor), min_effect, round.h,
                 round.h_clear, round.abs_floor, round.step, round.nanos);
    test->step_cap = OutlierStepCap(round.h, group.spike_rate);
  }
  round.step_cap = test ? test->step_cap : round.h / 2;
  const GroupStep g{opt, step.step, n, all, h, min_effect, ref, test ? &*test : nullptr};
  scored_.clear();
  for (size_t k = 0; k < n; ++k) {
    const Entry* other = n == 2 ? &es[peers_[1 - k]] : nullptr;
    RankScores* r = ScoreRank(g, es[peers_[k]], other, n >= 3 && healthy_[k], st);
    if (r == nullptr) continue;
    if (sections == 0) {
      UpdateRankFlag(r, &st);
    } else {
      scored_.push_back(r);
    }
  }
  if (sections == 0) return;
  if (step.sections != nullptr) ScoreSections(view, es, *step.sections, round, st);
  for (RankScores* r : scored_) UpdateRankFlag(r, &st);
}

void StragglerDetector::UpdateRankFlag(RankScores* r, StragglerState* st) {
  // A rank is flagged while its busy time or any of its sections is.
  bool now = r->busy.flagged;
  int64_t since = r->busy.flagged ? r->busy.since_step : INT64_MAX;
  int64_t since_nanos = r->busy.since_nanos;
  for (const SeriesTest& t : r->sections) {
    if (!t.flagged) continue;
    now = true;
    if (t.since_step < since) {
      since = t.since_step;
      since_nanos = t.since_nanos;
    }
  }
  if (r->flagged) ++r->flagged_steps;
  if (now && !r->flagged) {
    r->flagged_steps = 0;
    r->flagged_since_step = since;
    r->flagged_since_nanos = since_nanos;
  }
  if (now != r->flagged) st->flags_changed = true;
  r->flagged = now;
}

void StragglerDetector::ScoreSections(const JobView& view, const std::vector<Entry>& es,
                                      const std::vector<EntrySection>& values_of,
                                      const Round& round, StragglerState& st) {
  const EngineOptions& opt = view.options;
  const double min_effect = opt.straggler_rel_margin;
  const size_t sections = view.job.section_names.size();
  // One pass over the peers sorts their section values by section.
  by_section_.resize(sections);
  for (auto& values : by_section_) values.clear();
  for (size_t i : peers_) {
    const Entry& e = es[i];
    if (e.sections_count == 0) continue;
    RankScores& r = st.Mutable(e.rank, opt.straggler_window);
    if (r.sections.size() < sections) r.sections.resize(sections);
    for (uint32_t k = 0; k < e.sections_count; ++k) {
      const EntrySection& x = values_of[e.sections_begin + k];
      if (x.index < sections) by_section_[x.index].push_back({&r, x.seconds});
    }
  }
  for (size_t s = 0; s < sections; ++s) {
    const std::vector<SectionValue>& values = by_section_[s];
    const size_t m = values.size();
    if (m < 2) continue;
    double ref = 0, count = 0;
    if (m >= 3) {
      // As for busy time, the mean of the central part: the peers whose level in this section
      // (long-memory mean against the median of all) is within the minimum effect of the median
      // level, so that a rank persistently faster in this section does not make the others look
      // slow, while every exchangeable rank's excess keeps mean 0 however skewed the noise.
      scratch_.clear();
      for (const SectionValue& v : values) scratch_.push_back(v.seconds);
      const double all = MedianInPlace(scratch_);
      scratch_.clear();
      for (const SectionValue& v : values) {
        SeriesTest& t = v.rank->sections[s];
        if (all > 0) {
          if (t.level_steps < INT32_MAX) ++t.level_steps;
          const double a = std::max(1.0 / t.level_steps, static_cast<double>(kLevelMemory));
          t.level += static_cast<float>(a * (v.seconds / all - 1 - t.level));
        }
        if (t.level_steps >= kWarmupSteps) scratch_.push_back(t.level);
      }
      const bool levels_known = 2 * scratch_.size() >= m;
      const double centre = levels_known ? MedianInPlace(scratch_) : 0;
      in_reference_.assign(m, 0);
      for (size_t k = 0; k < m; ++k) {
        const SeriesTest& t = values[k].rank->sections[s];
        if (levels_known && t.level_steps >= kWarmupSteps &&
            std::fabs(t.level - centre) > min_effect) {
          continue;
        }
        ref += values[k].seconds;
        in_reference_[k] = 1;
        ++count;
      }
      if (2 * count < m) {
        ref = 0;
        for (const SectionValue& v : values) ref += v.seconds;
        in_reference_.assign(m, 1);
        count = static_cast<double>(m);
      }
      ref /= count;
    }
    const double sigma_measured = PeerNoise(
        m, [&](size_t k) { return &values[k].rank->sections[s]; }, &scratch_);
    std::optional<TestRound> test;
    if (sigma_measured >= 0) {
      test.emplace(std::max(sigma_measured, opt.straggler_noise_floor), min_effect, round.h,
                   round.h_clear, round.abs_floor, round.step, round.nanos);
      test->step_cap = round.step_cap;  // the busy time's: the same host's outliers
    }
    for (size_t k = 0; k < m; ++k) {
      const double rank_ref = m == 2 ? values[1 - k].seconds : ref;
      if (rank_ref <= 0) continue;
      SeriesTest& t = values[k].rank->sections[s];
      // Against the other peers of the reference, as for busy time (ScoreGroup).
      const double self = m >= 3 && in_reference_[k] && count > 1 ? count / (count - 1) : 1.0;
      const double rel = values[k].seconds / rank_ref - 1;
      if (test) UpdateSeriesForTest(rel, values[k].seconds - rank_ref, self, *test, &t);
      ObserveNoise(rel, &t);
    }
  }
}

}  // namespace stepwatch::analysis
