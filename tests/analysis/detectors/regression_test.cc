#include "analysis/detectors/regression.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "analysis/stats.h"
#include "tests/analysis/detectors/fixture.h"

namespace stepwatch::analysis {
namespace {

using testing::DetectorFixture;
using ::testing::HasSubstr;
using ::testing::Not;

// One rank's part of a synchronous step.
struct RankSplit {
  double data = 0;
  double compute = 0;
};

// A job of `ranks` ranks driven step by step in synchronous training: every rank ends the step
// together, at the slowest rank's busy time plus the collective (`comm`); the others wait for it.
class SyncJob {
 public:
  explicit SyncJob(int ranks, EngineOptions options = {})
      : fx_({&regression_}, ranks, options), ranks_(ranks) {
    for (int r = 0; r < ranks; ++r) fx_.AddRank(r, "node-0", r);
  }

  DetectorFixture& fx() { return fx_; }
  const EngineOptions& options() const { return fx_.options(); }
  int64_t next() const { return next_; }
  const std::vector<double>& step_times() const { return step_times_; }

  // Completes the next step; returns its step time.
  double Step(const std::vector<RankSplit>& split, double comm) {
    double max_busy = 0;
    for (const RankSplit& s : split) max_busy = std::max(max_busy, s.data + s.compute);
    const double step_seconds = max_busy + comm;
    std::vector<Entry> es;
    for (int r = 0; r < ranks_; ++r) {
      Entry e;
      e.rank = r;
      e.step_seconds = step_seconds;
      e.data = split[r].data;
      e.compute = split[r].compute;
      e.busy = e.data + e.compute;
      e.wait = step_seconds - e.busy;
      e.split = true;
      es.push_back(e);
    }
    JobRecord& job = fx_.job();
    const int64_t step = next_++;
    const int64_t nanos = (step + 1) * 1'000'000'000;
    std::vector<double> scratch;
    const StepSummary sum = Summarize(step, nanos, es, job.world_size, &scratch);
    job.summaries.Push(sum);
    ++job.completed_steps;
    job.max_step = std::max(job.max_step, step);
    job.last_completed = step;
    job.last_progress_nanos = nanos;
    const StepView view{step, nanos, sum.step_seconds, es};
    regression_.OnStep(fx_.view(), view, fx_.job().states[0].get());
    step_times_.push_back(step_seconds);
    return step_seconds;
  }

  // The same split on every rank.
  double Uniform(double data, double compute, double comm) {
    return Step(std::vector<RankSplit>(ranks_, RankSplit{data, compute}), comm);
  }

  std::vector<Finding> Findings() const { return fx_.Findings(); }

 private:
  RegressionDetector regression_;
  DetectorFixture fx_;
  int ranks_;
  int64_t next_ = 0;
  std::vector<double> step_times_;
};

double Median(std::vector<double> v) { return MedianInPlace(v); }

// Multiplicative noise of coefficient of variation `cv` (never below a fifth of the value), and
// now and then an outlier step 3-5x as long (a GC pause, a checkpoint).
class Noise {
 public:
  Noise(uint64_t seed, double cv, double outlier_rate = 0)
      : rng_(seed), cv_(cv), outlier_rate_(outlier_rate) {}
  double Factor() { return std::max(0.2, 1 + cv_ * normal_(rng_)); }
  double Outlier() { return uniform_(rng_) < outlier_rate_ ? 3 + 2 * uniform_(rng_) : 1; }
  double Uniform() { return uniform_(rng_); }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0, 1};
  std::uniform_real_distribution<double> uniform_{0, 1};
  double cv_;
  double outlier_rate_;
};

TEST(EngineRegressionDetectorTest, FindsTheShiftItsStepAndWhatRose) {
  SyncJob job(3);
  // Balanced at 1.0 s (0.8 s busy, 0.2 s collective), then rank 2 busier: the others wait for it
  // (imbalance rises).
  while (job.next() < 300) job.Step({{0, 0.8}, {0, 0.8}, {0, 0.8}}, 0.2);
  EXPECT_TRUE(job.Findings().empty());
  while (job.next() < 316) job.Step({{0, 0.8}, {0, 0.8}, {0, 1.1}}, 0.2);

  std::vector<Finding> found = job.Findings();
  ASSERT_EQ(found.size(), 1u);
  const Finding& f = found[0];
  EXPECT_EQ(f.kind, FindingKind::kRegression);
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.since_step, 300);
  EXPECT_EQ(f.since_unix_nanos, 301 * int64_t{1'000'000'000}) << "the change point's time";
  EXPECT_EQ(f.cause, Cause::kImbalance);
  EXPECT_NEAR(f.evidence.step_seconds.value_or(0), 1.3, 1e-6);
  EXPECT_NEAR(f.evidence.baseline_step_seconds.value_or(0), 1.0, 1e-6);
  EXPECT_NEAR(f.evidence.step_vs_baseline_ratio.value_or(0), 1.3, 1e-6);
  EXPECT_NEAR(f.evidence.rise_seconds.value_or(0), 0.3, 1e-6);
  // One rendering check: the summary words the same fields, the since-step is the finding's.
  EXPECT_EQ(f.summary,
            "step time up 30% since step 300: 1.30 s vs 1.00 s before; largest rise: waiting for "
            "slower ranks +300 ms per step");

  while (job.next() < 360) job.Step({{0, 0.8}, {0, 0.8}, {0, 0.8}}, 0.2);
  EXPECT_TRUE(job.Findings().empty()) << "not cleared back at the reference level";
}

// The brief's real regression: +30% at step 300 under 10% per-step noise is found within ~30
// steps, names the change point within a few steps, what rose (data loading) and by how much.
TEST(EngineRegressionDetectorTest, FindsARealRegressionInNoiseQuickly) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    SCOPED_TRACE(seed);
    SyncJob job(4);
    Noise noise(seed, 0.10);
    int64_t found_at = -1;
    Finding first;
    while (job.next() < 400) {
      const bool slow = job.next() >= 300;
      // 8 ms steps: 0.4 ms data, 5.6 ms compute, 2 ms collective; then data loading takes 2.8 ms
      // more (+30% of the step).
      const double f = noise.Factor();
      job.Uniform((slow ? 3.2e-3 : 0.4e-3) * f, 5.6e-3 * f, 2e-3 * f);
      std::vector<Finding> found = job.Findings();
      if (!slow) {
        ASSERT_TRUE(found.empty()) << found[0].summary;
      }
      if (found_at < 0 && !found.empty()) {
        found_at = job.next() - 1;
        first = found[0];
      }
    }
    ASSERT_GE(found_at, 300) << "not found";
    EXPECT_LE(found_at, 330);
    EXPECT_NEAR(first.since_step, 300, 3);
    EXPECT_EQ(first.cause, Cause::kDataLoading) << first.summary;
    EXPECT_GT(first.evidence.rise_seconds.value_or(0), 1.5e-3) << first.summary;
    EXPECT_THAT(first.summary, HasSubstr("largest rise: data loading +"));
    EXPECT_THAT(first.summary, HasSubstr("since step " + std::to_string(first.since_step) + ":"));
  }
}

// The baseline is the median step time just before the change point and the level the median
// after it (what the ranks measured), not a frozen window's nor a mean.
TEST(EngineRegressionDetectorTest, BaselineAndLevelAreTheMediansAroundTheChangePoint) {
  SyncJob job(2);
  Noise noise(7, 0.05);
  while (job.next() < 600) {
    const double f = noise.Factor();
    job.Uniform(0, (job.next() >= 500 ? 0.0125 : 0.008) * f, 0.002 * f);
  }
  std::vector<Finding> found = job.Findings();
  ASSERT_EQ(found.size(), 1u);
  const Finding& f = found[0];
  EXPECT_NEAR(f.since_step, 500, 2);
  const std::vector<double>& t = job.step_times();
  const size_t since = static_cast<size_t>(f.since_step);
  // The last 3 x regression_window steps before the change point (what a reference needs at
  // least: local, not a level from long before).
  const size_t ref = std::min<size_t>(since, 3 * job.options().regression_window);
  const std::vector<double> before(t.begin() + since - ref, t.begin() + since);
  const std::vector<double> after(t.end() - std::min<size_t>(t.size() - since, 64), t.end());
  EXPECT_DOUBLE_EQ(f.evidence.baseline_step_seconds.value_or(0), Median(before));
  EXPECT_DOUBLE_EQ(f.evidence.step_seconds.value_or(0), Median(after));
  EXPECT_NEAR(f.evidence.step_seconds.value_or(0), 0.0145, 0.0145 * 0.03);
  EXPECT_NEAR(f.evidence.baseline_step_seconds.value_or(0), 0.010, 0.010 * 0.03);
  EXPECT_THAT(f.summary, HasSubstr(" vs 10 ms before"));
}

// Healthy fast jobs: 8 ms steps with 10-30% per-step noise, an outlier step (3-5x) one step in
// 200, a warm-up (slow first steps, or faster ones), 50,000 steps each: never a regression.
TEST(EngineRegressionDetectorTest, HealthyNoisyFastRunsRaiseNothing) {
  int64_t steps = 0;
  for (const double cv : {0.10, 0.20, 0.30}) {
    for (const bool fast_start : {false, true}) {
      SCOPED_TRACE(::testing::PrintToString(cv) + (fast_start ? " fast start" : " slow start"));
      SyncJob job(4);
      Noise noise(static_cast<uint64_t>(cv * 100) + (fast_start ? 1 : 0), cv, 0.005);
      const int64_t n = 50'000;
      int64_t raised = 0;
      while (job.next() < n) {
        const int64_t s = job.next();
        double warm = 1;
        if (fast_start) {
          warm = s < 40 ? 0.6 : 1;  // e.g. prefetched batches, caches
        } else if (s < 10) {
          warm = 8;  // compilation, autotuning
        } else if (s < 80) {
          warm = 1 + 0.8 * std::exp(-(s - 10) / 15.0);
        }
        const double f = noise.Factor() * noise.Outlier() * warm;
        std::vector<RankSplit> split(4);
        for (RankSplit& r : split) r = {0.4e-3 * f, 5.6e-3 * f * (1 + 0.02 * noise.Uniform())};
        job.Step(split, 2e-3 * f);
        if (!job.Findings().empty()) ++raised;
      }
      steps += n;
      EXPECT_EQ(raised, 0) << job.Findings()[0].summary;
    }
  }
  EXPECT_EQ(steps, 300'000);
}

// Compute rose on every rank: no part of the split names a cause (unknown), and the summary says
// what rose with its real size, never "+0 ms".
TEST(EngineRegressionDetectorTest, ComputeRiseOnEveryRankNamesNoComponent) {
  SyncJob job(4);
  Noise noise(3, 0.03);
  while (job.next() < 420) {
    const double f = noise.Factor();
    job.Uniform(0.4e-3 * f, (job.next() >= 300 ? 7.6e-3 : 5.6e-3) * f, 2e-3 * f);
  }
  std::vector<Finding> found = job.Findings();
  ASSERT_EQ(found.size(), 1u);
  const Finding& f = found[0];
  EXPECT_EQ(f.cause, Cause::kUnknown);
  EXPECT_NEAR(f.evidence.rise_seconds.value_or(0), 2e-3, 0.4e-3);
  EXPECT_THAT(f.summary, HasSubstr("largest rise: compute +"));
  EXPECT_THAT(f.summary, Not(HasSubstr("+0 ms")));
  EXPECT_THAT(f.summary, Not(HasSubstr("exposed communication")));
  EXPECT_THAT(f.summary, Not(HasSubstr("waiting for slower ranks")));
  EXPECT_THAT(f.summary, Not(HasSubstr("data loading")));
  EXPECT_THAT(f.action, HasSubstr("compute rose on every rank"));
}

// The step took longer but no part of its split rose measurably (each part's rise is lost in its
// own noise): the cause is unknown and the summary says so instead of "+0 ms".
TEST(EngineRegressionDetectorTest, NoPartRoseMeasurablySaysSo) {
  SyncJob job(4);
  Noise noise(11, 0.02);
  while (job.next() < 420) {
    // The busy time moves between data and compute at random, step by step.
    const double busy = (job.next() >= 300 ? 8.5e-3 : 6e-3) * noise.Factor();
    const double u = noise.Uniform();
    job.Uniform(busy * u, busy * (1 - u), 2e-3 * noise.Factor());
  }
  std::vector<Finding> found = job.Findings();
  ASSERT_EQ(found.size(), 1u);
  const Finding& f = found[0];
  EXPECT_EQ(f.cause, Cause::kUnknown);
  EXPECT_EQ(f.evidence.rise_seconds, 0.0);
  EXPECT_THAT(f.summary, HasSubstr("; no single part of the split rose measurably"));
  EXPECT_THAT(f.summary, Not(HasSubstr("+0")));
  EXPECT_EQ(f.action, "profile a step (no dominant loss in the step's split)");
}

// The cause is decided once, when the regression is raised, and kept while it lasts, however the
// split moves afterwards; so are its since-step and baseline.
TEST(EngineRegressionDetectorTest, CauseDoesNotChangeWhileTheFindingLasts) {
  SyncJob job(4);
  Noise noise(5, 0.05);
  std::set<std::string> causes;
  std::set<int64_t> since;
  std::set<double> baselines;
  int64_t found_steps = 0;
  while (job.next() < 1500) {
    const int64_t s = job.next();
    const double f = noise.Factor();
    // Data loading rises at 300; from 700 the collective slows down as well, more than data did.
    job.Uniform((s >= 300 ? 4e-3 : 0.4e-3) * f, 5.6e-3 * f, (s >= 700 ? 8e-3 : 2e-3) * f);
    for (const Finding& x : job.Findings()) {
      ++found_steps;
      causes.insert(CauseName(x.cause));
      since.insert(x.since_step);
      baselines.insert(*x.evidence.baseline_step_seconds);
    }
  }
  EXPECT_GT(found_steps, 1100);
  EXPECT_EQ(causes, std::set<std::string>{"data_loading"});
  EXPECT_EQ(since.size(), 1u);
  EXPECT_EQ(baselines.size(), 1u);
}

// A cleared regression cannot come straight back for the same shift: after it clears, a new one
// needs a fresh reference (3 x regression_window steps from after the clear, older than the last
// 4 x regression_window) and the whole test again. A job that goes straight back up raises
// nothing (that level is its reference now); one that stays recovered for a while and then slows
// down again raises a new regression, from its own change point.
TEST(EngineRegressionDetectorTest, AClearedRegressionDoesNotComeStraightBack) {
  for (const int64_t recovered : {3, 200}) {
    SCOPED_TRACE(recovered);
    SyncJob job(4);
    auto step = [&](double compute) { job.Uniform(0, compute, 2e-3); };
    while (job.next() < 300) step(6e-3);
    while (job.next() < 340) step(9e-3);
    ASSERT_EQ(job.Findings().size(), 1u);
    int64_t cleared = -1;
    while (cleared < 0) {
      step(6e-3);
      if (job.Findings().empty()) cleared = job.next() - 1;
    }
    EXPECT_LE(cleared, 340 + 2 * job.options().regression_window);
    for (int64_t i = 0; i < recovered; ++i) step(6e-3);
    const int64_t up = job.next();
    int64_t raised = 0;
    std::set<int64_t> since;
    while (job.next() < up + 600) {
      step(9e-3);
      for (const Finding& f : job.Findings()) {
        ++raised;
        since.insert(f.since_step);
      }
    }
    if (recovered == 3) {
      EXPECT_EQ(raised, 0);
    } else {
      EXPECT_GT(raised, 550);
      EXPECT_EQ(since, std::set<int64_t>{up});
    }
  }
}

// The first regression_warmup_steps steps are no reference: a faster start (then the steady
// level) is not a regression, while the same rise later is.
TEST(EngineRegressionDetectorTest, AFasterWarmupIsNoReference) {
  {
    SyncJob job(2);
    while (job.next() < 40) job.Uniform(0, 3e-3, 2e-3);
    while (job.next() < 1000) job.Uniform(0, 6e-3, 2e-3);
    EXPECT_TRUE(job.Findings().empty());
  }
  SyncJob job(2);
  while (job.next() < 300) job.Uniform(0, 3e-3, 2e-3);
  while (job.next() < 340) job.Uniform(0, 6e-3, 2e-3);
  ASSERT_EQ(job.Findings().size(), 1u);
  EXPECT_EQ(job.Findings()[0].since_step, 300);
}

// A shift under regression_threshold is no regression, however significant.
TEST(EngineRegressionDetectorTest, ASmallShiftIsNoRegression) {
  SyncJob job(2);
  while (job.next() < 300) job.Uniform(0, 8e-3, 2e-3);
  while (job.next() < 1000) job.Uniform(0, 8.9e-3, 2e-3);  // +9% of the step
  EXPECT_TRUE(job.Findings().empty());
}

// The sliding windows' median and MAD are the ones a selection gives.
TEST(EngineRegressionDetectorTest, SortedWindowMedianAndMadMatchASelection) {
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int> value(0, 40);  // many ties
  SortedWindow w;
  std::vector<float> kept;
  for (int i = 0; i < 2000; ++i) {
    const float x = static_cast<float>(value(rng)) / 8;
    w.Insert(x);
    kept.push_back(x);
    if (kept.size() > 37) {
      w.Erase(kept.front());
      kept.erase(kept.begin());
    }
    std::vector<double> v(kept.begin(), kept.end());
    const double median = MedianInPlace(v);
    ASSERT_EQ(w.size(), kept.size());
    ASSERT_DOUBLE_EQ(w.Median(), median);
    for (double& d : v) d = std::abs(d - median);
    ASSERT_DOUBLE_EQ(w.Mad(median), MedianInPlace(v)) << i;
  }
}

TEST(EngineRegressionDetectorTest, WindowsComeFromTheOptions) {
  EngineOptions opt;
  opt.regression_window = 4;
  opt.regression_reference = 8;
  opt.regression_warmup_steps = 0;
  RegressionDetector regression;
  DetectorFixture fx({&regression}, 2, opt);
  for (int r = 0; r < 2; ++r) fx.AddRank(r, "node-0", r);
  // A reference needs min(8, 3 x 4) steps before the last 4 x 4.
  for (int64_t s = 0; s < 24; ++s) fx.Step(s, 1.0, {0.8, 0.8});
  for (int64_t s = 24; s < 28; ++s) fx.Step(s, 1.5, {0.8, 0.8});
  std::vector<Finding> found = fx.Findings();
  ASSERT_EQ(found.size(), 1u) << "a 4-step window should see a 4-step shift";
  EXPECT_EQ(found[0].since_step, 24);
}

}  // namespace
}  // namespace stepwatch::analysis
