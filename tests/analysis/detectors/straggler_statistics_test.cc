// The straggler detector's statistics through the engine: evidence that accumulates with the steps,
// references that survive many slow ranks, false alarms controlled across ranks, onsets, clearing
// without flapping, and named sections.
#include "analysis/detectors/straggler_statistics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::analysis {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSec = 1'000'000'000;
constexpr int64_t kStart = 1'800'000'000'000'000'000;

// A synchronous data-parallel job: every rank's step is three named sections of `section_s`
// seconds each with Gaussian noise (coefficient of variation `noise_cv` per section), then the
// collective (each rank waits for the slowest); `extra(rank, step, section)` adds seconds.
class SyncJob {
 public:
  SyncJob(Engine* engine, int world, int gpus_per_node, uint64_t seed)
      : engine_(engine), world_(world), gpus_per_node_(gpus_per_node), rng_(seed) {}

  double section_s = 0.010;
  double noise_cv = 0.3;
  double comm_s = 0.002;
  bool report_sections = true;
  std::function<double(int rank, int64_t step, int section)> extra = [](int, int64_t, int) {
    return 0.0;
  };
  // Persistent per-rank factor on every section (uneven but healthy ranks).
  std::function<double(int rank)> rank_factor = [](int) { return 1.0; };

  // Runs `n` steps; after each, `each(step)` may look at the engine.
  void Run(int64_t n, const std::function<void(int64_t)>& each = nullptr) {
    static const char* const kNames[] = {"forward", "backward", "optimizer"};
    std::normal_distribution<double> normal(0, 1);
    std::vector<std::array<double, 3>> sec(world_);
    std::vector<double> busy(world_);
    for (int64_t i = 0; i < n; ++i, ++step_) {
      double max_busy = 0;
      for (int r = 0; r < world_; ++r) {
        busy[r] = 0;
        for (int k = 0; k < 3; ++k) {
          sec[r][k] = std::max(0.0, section_s * rank_factor(r) * (1 + noise_cv * normal(rng_))) +
                      extra(r, step_, k);
          busy[r] += sec[r][k];
        }
        max_busy = std::max(max_busy, busy[r]);
      }
      const double step_s = max_busy + comm_s;
      now_ += static_cast<int64_t>(step_s * kSec);
      for (int r = 0; r < world_; ++r) {
        StepEvent x;
        x.job = "job";
        x.rank = r;
        x.world_size = world_;
        x.step = step_;
        x.step_seconds = step_s;
        x.data_seconds = 0;
        x.compute_seconds = busy[r];
        x.comm_seconds = step_s - busy[r];
        x.gpu = r % gpus_per_node_;
        x.node = "node-" + std::to_string(r / gpus_per_node_);
        x.pid = 1000 + r;
        x.received_unix_nanos = now_;
        if (report_sections) {
          for (int k = 0; k < 3; ++k) x.sections.push_back({kNames[k], sec[r][k]});
        }
        EXPECT_OK(engine_->AddStep(x));
      }
      if (each) each(step_);
    }
  }
  int64_t step() const { return step_; }

 private:
  Engine* engine_;
  int world_;
  int gpus_per_node_;
  std::mt19937_64 rng_;
  int64_t step_ = 0;
  int64_t now_ = kStart;
};

// Ranks named by straggler findings and by the `ranks` of slow-node findings.
std::set<int> FlaggedRanks(const Engine& e) {
  std::set<int> out;
  for (const Finding& f : e.Findings()) {
    if (f.kind == FindingKind::kStraggler) out.insert(f.rank);
    if (f.kind == FindingKind::kSlowNode) out.insert(f.ranks.begin(), f.ranks.end());
  }
  return out;
}

// Runs until every rank of `slow` is flagged (or `limit` steps); returns the steps taken and
// fails on any other rank flagged.
int64_t StepsUntilFlagged(SyncJob& job, const Engine& e, const std::set<int>& slow, int64_t limit) {
  int64_t found = -1;
  const int64_t first = job.step();
  for (int64_t i = 0; i < limit && found < 0; ++i) {
    job.Run(1);
    const std::set<int> flagged = FlaggedRanks(e);
    for (int r : flagged) EXPECT_TRUE(slow.count(r)) << "healthy rank " << r << " flagged";
    if (std::includes(flagged.begin(), flagged.end(), slow.begin(), slow.end())) {
      found = job.step() - first;
    }
  }
  return found;
}

TEST(StragglerStatisticsTest, ModerateStragglerUnderRealisticNoiseIsFlagged) {
  // 4 ranks, three sections of 10 ms +- 3 ms each (17% noise per step); one section of rank 1 at
  // 15 ms (+5 ms: the step +16.7%). One 16-step window's margin (19%) never saw it; accumulated
  // evidence does, within 100 steps on every seed.
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    Engine e;
    SyncJob job(&e, 4, 4, seed);
    job.extra = [](int rank, int64_t, int section) {
      return rank == 1 && section == 1 ? 0.005 : 0.0;
    };
    const int64_t steps = StepsUntilFlagged(job, e, {1}, 100);
    EXPECT_GT(steps, 0) << "seed " << seed << ": not flagged in 100 steps";
  }
}

TEST(StragglerStatisticsTest, EvidenceGrowsWithStepsSoSmallSlowdownsAreFoundEventually) {
  // An 8% slowdown of the busy time (2.4 ms, over the 2 ms floor) at 17% noise: invisible to any
  // one 16-step window, found eventually.
  Engine e;
  SyncJob job(&e, 8, 8, 3);
  job.extra = [](int rank, int64_t, int) { return rank == 5 ? 0.0008 : 0.0; };
  const int64_t steps = StepsUntilFlagged(job, e, {5}, 3000);
  EXPECT_GT(steps, 0) << "a sustained 8% slowdown was never flagged";
  EXPECT_GT(steps, 16) << "flagged from one window's worth of noisy steps";
}

TEST(StragglerStatisticsTest, HalfOfTheRanksSlowAreAllFlagged) {
  struct Case {
    int world;
    std::set<int> slow;
  };
  std::set<int> sixteen, thirty_two;
  for (int r = 0; r < 16; ++r) sixteen.insert(r * 4 + 1);
  for (int r = 0; r < 32; ++r) thirty_two.insert(r * 2);
  for (const Case& c : {Case{4, {1, 2}}, Case{64, sixteen}, Case{64, thirty_two}}) {
    Engine e;
    SyncJob job(&e, c.world, 1, 11);  // one rank per node: no slow-node grouping
    job.noise_cv = 0.05;
    job.extra = [&](int rank, int64_t, int) { return c.slow.count(rank) ? 0.001 : 0.0; };  // +10%
    const int64_t steps = StepsUntilFlagged(job, e, c.slow, 400);
    EXPECT_GT(steps, 0) << c.slow.size() << " of " << c.world << " slow: not all flagged";
  }
}

TEST(StragglerStatisticsTest, OneWholeNodeOfTwoIsASlowNode) {
  Engine e;
  SyncJob job(&e, 16, 8, 5);
  job.noise_cv = 0.05;
  job.extra = [](int rank, int64_t, int) { return rank >= 8 ? 0.0015 : 0.0; };  // +15%
  std::set<int> slow;
  for (int r = 8; r < 16; ++r) slow.insert(r);
  ASSERT_GT(StepsUntilFlagged(job, e, slow, 400), 0);
  std::vector<Finding> f = e.Findings();
  ASSERT_EQ(f.size(), 1u) << f[0].summary;
  EXPECT_EQ(f[0].kind, FindingKind::kSlowNode);
  EXPECT_EQ(f[0].node, "node-1");
  EXPECT_EQ(f[0].ranks.size(), 8u);
}

TEST(StragglerStatisticsTest, ALateSlowdownIsFlaggedAsFastAsOneFromTheStartAndNamesItsOnset) {
  std::vector<int64_t> from_start, late;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    for (int64_t onset : {int64_t{0}, int64_t{1500}}) {
      Engine e;
      SyncJob job(&e, 8, 8, seed);
      job.noise_cv = 0.1;
      job.extra = [&](int rank, int64_t step, int) {
        return rank == 2 && step >= onset ? 0.0025 : 0.0;  // +8% of the busy time
      };
      job.Run(onset);
      ASSERT_TRUE(e.Findings().empty()) << "flagged while healthy";
      const int64_t steps = StepsUntilFlagged(job, e, {2}, 1000);
      ASSERT_GT(steps, 0);
      (onset == 0 ? from_start : late).push_back(steps);
      const std::vector<Finding> f = e.Findings();
      ASSERT_EQ(f.size(), 1u);
      EXPECT_NEAR(static_cast<double>(f[0].since_step), static_cast<double>(onset), 25)
          << "the change point";
    }
  }
  std::sort(from_start.begin(), from_start.end());
  std::sort(late.begin(), late.end());
  // Medians over the seeds: the late slowdown takes at most 1.5x the steps (plus the few steps a
  // statistic needs to leave zero).
  EXPECT_LE(late[3], from_start[3] * 3 / 2 + 4);
}

TEST(StragglerStatisticsTest, ASmoothSpreadWithNoSlowGroupFlagsNoOne) {
  Engine e;
  SyncJob job(&e, 64, 8, 9);
  job.noise_cv = 0.03;
  // Persistent differences evenly spread over -3%..+3%: no separate slow group.
  job.rank_factor = [](int rank) { return 0.97 + 0.06 * rank / 63.0; };
  job.Run(3000, [&](int64_t step) {
    if (step % 100 == 0) {
      ASSERT_TRUE(e.Findings().empty()) << e.Findings()[0].summary;
    }
  });
  EXPECT_TRUE(e.Findings().empty());
}

TEST(StragglerStatisticsTest, HealthyJobsRaiseNoFalseFlagsAtAnyNoiseOrSize) {
  // 64 ranks x 4000 steps at 5% and at 20% noise, and 1,024 ranks x 250 steps: 0 findings.
  struct Case {
    int world;
    double noise;
    int64_t steps;
  };
  for (const Case& c : {Case{64, 0.05, 4000}, Case{64, 0.2, 4000}, Case{1024, 0.2, 250}}) {
    Engine e;
    SyncJob job(&e, c.world, 8, 21);
    job.noise_cv = c.noise;
    int64_t flags = 0;
    job.Run(c.steps, [&](int64_t) { flags += static_cast<int64_t>(FlaggedRanks(e).size()); });
    EXPECT_EQ(flags, 0) << c.world << " ranks at " << c.noise << " noise";
  }
}

TEST(StragglerStatisticsTest, ClearsAfterRecoveryAndDoesNotFlapAtTheBoundary) {
  Engine e;
  SyncJob job(&e, 8, 8, 4);
  job.noise_cv = 0.05;
  // 30% slower for 300 steps, then as fast as its peers.
  job.extra = [](int rank, int64_t step, int) { return rank == 6 && step < 300 ? 0.003 : 0.0; };
  int changes = 0;
  bool was = false;
  int64_t cleared_at = -1;
  job.Run(900, [&](int64_t step) {
    const bool now = FlaggedRanks(e).count(6) > 0;
    if (now != was) ++changes;
    if (was && !now) cleared_at = step;
    was = now;
  });
  EXPECT_EQ(changes, 2) << "flagged once and cleared once";
  EXPECT_GT(cleared_at, 300);
  EXPECT_LT(cleared_at, 500) << "not cleared within 200 steps of recovery";

  // A rank slower by about the minimum effect for a long time: flagged once, then kept.
  Engine e2;
  SyncJob job2(&e2, 8, 8, 8);
  job2.noise_cv = 0.05;
  job2.extra = [](int rank, int64_t, int) { return rank == 3 ? 0.0018 : 0.0; };  // +6%
  changes = 0;
  was = false;
  job2.Run(4000, [&](int64_t) {
    const bool now = FlaggedRanks(e2).count(3) > 0;
    if (now != was) ++changes;
    was = now;
  });
  EXPECT_EQ(changes, 1) << "the flag flapped";
  EXPECT_TRUE(was);
}

TEST(StragglerStatisticsTest, AStragglerInOneSectionThatTheSumHidesIsFoundAndNamed) {
  Engine e;
  SyncJob job(&e, 8, 8, 6);
  job.noise_cv = 0.1;
  // Rank 3's backward takes 50% longer while its forward is as much shorter: the same busy time.
  job.extra = [](int rank, int64_t, int section) {
    if (rank != 3) return 0.0;
    return section == 1 ? 0.005 : section == 0 ? -0.005 : 0.0;
  };
  ASSERT_GT(StepsUntilFlagged(job, e, {3}, 300), 0);
  const std::vector<Finding> f = e.Findings();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 3);
  ASSERT_TRUE(f[0].evidence.section.has_value());
  EXPECT_EQ(*f[0].evidence.section, "backward");
  // Against the mean of the peers' backward: rank 3's included (15 / 10.6 ms) until its level in
  // the section is known, then left out (15 / 10 ms).
  EXPECT_GT(f[0].evidence.section_vs_reference_ratio.value_or(0), 1.35);
  EXPECT_LT(f[0].evidence.section_vs_reference_ratio.value_or(0), 1.6);
  EXPECT_THAT(f[0].summary, HasSubstr("section backward +"));

  // The per-rank section medians, in the job's section order.
  const std::vector<RankSnapshot> ranks = e.Ranks("job");
  ASSERT_EQ(ranks.size(), 8u);
  ASSERT_EQ(ranks[3].sections.size(), 3u);
  EXPECT_EQ(ranks[3].sections[1].name, "backward");
  EXPECT_NEAR(ranks[3].sections[1].seconds, 0.015, 0.002);
  EXPECT_NEAR(ranks[0].sections[1].seconds, 0.010, 0.002);
  const std::optional<JobSnapshot> snap = e.Job("job");
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->section_names, (std::vector<std::string>{"forward", "backward", "optimizer"}));
}

TEST(StragglerStatisticsTest, SectionNamesBeyondTheLimitAreFoldedAndCounted) {
  Engine e;
  for (int r = 0; r < 2; ++r) {
    StepEvent x;
    x.job = "many";
    x.rank = r;
    x.world_size = 2;
    x.step = 0;
    x.step_seconds = 0.1;
    x.compute_seconds = 0.05;
    x.node = "n";
    x.received_unix_nanos = kStart;
    // Rank 0 names s0..s15, rank 1 s4..s19: its last four names are over the job's limit.
    for (int k = 4 * r; k < kMaxSectionsPerJob + 4 * r; ++k) {
      x.sections.push_back({"s" + std::to_string(k), 0.001});
    }
    ASSERT_OK(e.AddStep(x));
  }
  const std::optional<JobSnapshot> snap = e.Job("many");
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->section_names.size(), static_cast<size_t>(kMaxSectionsPerJob));
  EXPECT_EQ(snap->section_names.back(), "s15");
  EXPECT_EQ(snap->sections_folded, 4);
}

// The peers' noise is known once half of them have measured their own: in a group of three or
// more after half the warm-up (the median holds up against a few poor early estimates), in a pair
// (whose median is the mean of the two) only after the full warm-up.
TEST(StragglerStatisticsTest, PeerNoiseIsKnownAfterHalfTheWarmUpInGroupsOfThreeOrMore) {
  std::vector<SeriesTest> series(4);
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 0.05);
  std::vector<double> scratch;
  auto peer_noise = [&](size_t count) {
    return PeerNoise(
        count, [&](size_t i) { return &series[i]; }, &scratch);
  };
  for (int32_t step = 1; step <= kWarmupSteps; ++step) {
    for (SeriesTest& t : series) ObserveNoise(noise(rng), &t);
    const bool group_knows = step >= kPeerWarmupSteps;
    const bool pair_knows = step >= kWarmupSteps;
    EXPECT_EQ(peer_noise(4) >= 0, group_knows) << "step " << step;
    EXPECT_EQ(peer_noise(3) >= 0, group_knows) << "step " << step;
    EXPECT_EQ(peer_noise(2) >= 0, pair_knows) << "step " << step;
  }
  EXPECT_LT(kPeerWarmupSteps, kWarmupSteps);
  EXPECT_GT(peer_noise(4), 0.01);
}

}  // namespace
}  // namespace stepwatch::analysis

namespace stepwatch::analysis {
namespace {

TEST(OutlierStepCapTest, RareOutliersLetTwoStepsFlagCommonOnesNeedMore) {
  const double h = 19;
  EXPECT_DOUBLE_EQ(OutlierStepCap(h, 0), h / 2);
  EXPECT_DOUBLE_EQ(OutlierStepCap(h, 1e-6), h / 2);  // Gaussian noise: outliers rarer than e^-9.5
  EXPECT_NEAR(OutlierStepCap(h, 1.0 / 64), std::log(64.0), 1e-9);  // one outlier in 64 steps
  EXPECT_DOUBLE_EQ(OutlierStepCap(h, 0.5), h / 8);                 // never under h / 8
}

TEST(OutlierStepCapTest, OutlierStepsRaiseTheSeriesSpikeRate) {
  SeriesTest t;
  for (int i = 0; i < 100; ++i) ObserveNoise(0.01 * (i % 2), &t);
  EXPECT_EQ(t.spike_rate, 0);
  ObserveNoise(5.0, &t);  // a descheduled step
  EXPECT_GT(t.spike_rate, 0.01);
}

}  // namespace
}  // namespace stepwatch::analysis
