// stepwatch-detection-grid: straggler detection over a grid of synthetic data-parallel jobs, the
// same draws fed to stepwatch's engine, to two reference detectors and to an oracle.
//
// The draws. Every rank's step is three named sections, "forward" (30 ms), "backward" (60 ms) and
// "optimizer" (10 ms), plus 2 ms of data loading; each of the four gets independent Gaussian noise
// with the cell's coefficient of variation (sd = noise x its base, clipped at 0). compute_s is the
// sum of the sections, busy = data_s + compute_s, and the job is synchronous: every rank's step_s
// is the slowest rank's busy time plus an 8 ms collective, and comm_s = step_s - busy (the wait
// for the slowest rank plus the collective). The nominal step is 110 ms; a fault adds `effect` x
// 110 ms to each slow rank's busy time from its onset on, either spread over the three sections in
// proportion to their base ("spread") or all in "backward". Slow ranks are drawn at random per
// seed; ranks sit 8 to a node ("node-<rank / 8>"). Seeds derive from the cell and the repetition,
// so a cell's draws do not depend on which other cells run (the --quick grid repeats some of the
// full grid's cells exactly).
//
// The grid: worlds 2, 4, 64, 1024; 1, 2, 1/4 and 1/2 of the world slow (counts under 1, the whole
// world, or repeated are left out); effects 5, 10, 17, 30, 50%; noise 1, 5, 17, 30%; onset at
// step 0 or mid-run (step 100 + 7 x repetition mod 16, so that it falls at different phases of
// the 16-step windows); spread or backward. 5 seeds per cell, 2 at world 1024. A run lasts from
// its onset for twice the oracle's expected steps to detection, at least 400 and at most 1500
// steps, so that every cell can be detected within it.
//
// The detectors, all on the same draws:
//  - stepwatch: analysis::Engine with default options, fed step by step (AddStep for every rank,
//    then Advance to the step's end). A rank counts as flagged while it is the rank of a straggler
//    finding or one of the `ranks` of a slow_node or pipeline_imbalance finding.
//  - nvrx: NVIDIA Resiliency Extension's straggler scores, as its public documentation and source
//    describe them (github.com/NVIDIA/nvidia-resiliency-ext: docs/source/straggler_det/
//    usage_guide.rst, src/nvidia_resiliency_ext/straggler/reporting.py and straggler.py). Each
//    section's times are collected per rank and summarised when a report is generated (every
//    kNvrxInterval steps here, like calling generate_report() every STRAGGLER_REPORT_INTERVAL
//    iterations); the collected times are cleared after every report. Per section and rank the
//    summary is the median of the report window's times (torch.median: the lower middle value of
//    an even count). Relative score = the smallest median over all ranks / the rank's median;
//    individual score = the smallest median this rank has had in any report so far, this one
//    included (its "historical min", updated before scoring) / the rank's current median.
//    Report.identify_stragglers() flags a rank when any section's relative or individual score is
//    below 0.75 (its default thresholds). NVRx's GPU score aggregates CUDA kernel times, which
//    these draws do not have; the whole busy time is scored as a fourth section in its place.
//  - mad: a plain robust rule. Over a sliding window of the last 16 steps, each rank's mean busy
//    time and mean of each section; a rank is flagged when, for any of them, its mean exceeds the
//    median of all ranks' means by more than 3 x 1.4826 x MAD (the MAD across ranks) and by at
//    least 5% of that median.
//  - oracle: a CUSUM that knows the truth: the reference of each step is the median of the truly
//    healthy ranks, the series is the one the fault is in (backward, or the busy time when
//    spread), the drift is the true relative effect and the noise the true per-step sd of a rank's
//    relative excess. It flags when its statistic max(0, S + d z - d^2/2) (z the standardised
//    excess, d the standardised drift) crosses h = ln(ranks tested) + ln(1/alpha), alpha = 1e-7
//    per step (kOracleAlpha): a CUSUM's run length to a false alarm is at least e^h steps, so the
//    whole job sees one false alarm per 1/alpha steps, the false-alarm budget stepwatch is held
//    to. Its steps to detection are a lower bound for any detector with that budget.
//
// Per cell and detector: recall (slow ranks flagged by a decision at or after the onset / slow
// ranks, over all seeds), false flags (ranks flagged while healthy, i.e. a healthy rank at any
// step or a slow rank before its onset, counted once per rank and seed, summed over seeds) and
// the median steps to detection (onset to the first such flag of each detected slow rank,
// counting the onset step as 1). Then a healthy run (no fault) of about 10^6 rank-steps at 5% and
// at 20% noise (8 ranks x 125,000 steps and 1,024 x 1,000 each), plus 100,000 ranks x 20 steps,
// counts each detector's false flags and times the engine (thread CPU time).
//
// Verdict per cell, stepwatch against each peer (nvrx, mad): it loses when it has more false
// flags than the peer; or, against a peer with no more false flags than stepwatch, when it has
// lower recall or, at equal recall, more median steps. Ties pass. A peer that flags more healthy
// ranks is not credited with its recall or speed (flagging every rank gives full recall at the
// first look); the summary counts the literal reading too (worse than either peer on any figure).
// --check exits 1 when stepwatch loses in any cell or flags any rank of the healthy run.
#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "analysis/engine.h"

namespace {

namespace an = stepwatch::analysis;

constexpr char kUsage[] =
    "usage: stepwatch-detection-grid [--quick] [--check] [--csv FILE] [--world N]\n"
    "  Runs the straggler detection grid (stepwatch, NVRx's scores, a median+MAD rule, an\n"
    "  oracle CUSUM) and a healthy run, and prints Markdown tables.\n"
    "  --quick    a reduced grid (worlds 4 and 64, effects 10% and 30%, noise 5% and 17%) and a\n"
    "             shorter healthy run\n"
    "  --check    exit 1 when stepwatch loses to a reference detector in any cell (more false\n"
    "             flags; lower recall or, at equal recall, more median steps than a peer with\n"
    "             no more false flags) or flags a rank in the healthy run\n"
    "  --csv FILE also write every cell's and healthy run's figures as CSV\n"
    "  --world N  run only the cells (and healthy runs) of world size N\n";

// CPU time of this thread: the machines this runs on are shared, so wall time says little.
double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// ---- the draws ---------------------------------------------------------------------------

constexpr int kSections = 3;
constexpr std::array<const char*, kSections> kSectionNames = {"forward", "backward", "optimizer"};
constexpr std::array<double, kSections> kSectionBase = {0.030, 0.060, 0.010};
constexpr int kBackward = 1;
constexpr double kDataBase = 0.002;
constexpr double kCollective = 0.008;
constexpr double kBusyBase = kDataBase + 0.030 + 0.060 + 0.010;
constexpr double kNominalStep = kBusyBase + kCollective;  // 110 ms
constexpr int64_t kStartNanos = 1'800'000'000'000'000'000;
constexpr int kRanksPerNode = 8;

// Series the reference detectors score: 0 the busy time, 1 + i section i.
constexpr int kSeries = 1 + kSections;
constexpr int kBusySeries = 0;
constexpr int kBackwardSeries = 1 + kBackward;

struct Cell {
  int world = 0;
  int slow = 0;
  double effect = 0;  // share of the nominal step added to a slow rank's busy time
  double noise = 0;   // coefficient of variation of each section and of data loading
  bool mid = false;   // onset mid-run (else at step 0)
  bool backward = false;
  int seeds = 0;
  int64_t horizon = 0;  // steps from the onset to the end of the run
  bool healthy = false;
};

std::string SlowLabel(const Cell& c) {
  std::string s = std::to_string(c.slow);
  if (c.slow == c.world / 4 && c.slow > 2) s += " (1/4)";
  if (c.slow == c.world / 2 && c.slow > 2) s += " (1/2)";
  return s;
}

std::string Percent(double v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100 * v);
  return buf;
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t SeedOf(const Cell& c, int rep) {
  uint64_t h = SplitMix(static_cast<uint64_t>(c.world));
  h = SplitMix(h ^ static_cast<uint64_t>(c.slow));
  h = SplitMix(h ^ static_cast<uint64_t>(std::llround(c.effect * 1000)));
  h = SplitMix(h ^ static_cast<uint64_t>(std::llround(c.noise * 1000)));
  h = SplitMix(h ^ (c.mid ? 1u : 0u) ^ (c.backward ? 2u : 0u) ^ (c.healthy ? 4u : 0u));
  return SplitMix(h ^ static_cast<uint64_t>(rep));
}

// One step of every rank.
struct StepData {
  int64_t step = 0;
  int64_t end_nanos = 0;
  double step_seconds = 0;
  std::vector<double> data, comm;
  std::array<std::vector<double>, kSeries> series;  // busy, forward, backward, optimizer
};

class Draw {
 public:
  Draw(const Cell& cell, int rep) : cell_(cell), rng_(SeedOf(cell, rep)) {
    slow_.assign(cell.world, 0);
    if (!cell.healthy) {
      std::vector<int> order(cell.world);
      for (int r = 0; r < cell.world; ++r) order[r] = r;
      for (int i = 0; i < cell.slow; ++i) {
        std::uniform_int_distribution<int> pick(i, cell.world - 1);
        std::swap(order[i], order[pick(rng_)]);
        slow_[order[i]] = 1;
      }
    }
    // Mid-run onsets vary with the repetition so that they fall at different phases of the
    // reference detectors' windows.
    onset_ = cell.mid ? 100 + (7 * rep) % 16 : 0;
    steps_ = onset_ + cell.horizon;
    extra_.fill(0);
    const double extra = cell.effect * kNominalStep;
    if (cell.backward) {
      extra_[kBackward] = extra;
    } else {
      for (int i = 0; i < kSections; ++i)
        extra_[i] = extra * kSectionBase[i] / (kBusyBase - kDataBase);
    }
  }

  const std::vector<char>& slow() const { return slow_; }
  int64_t onset() const { return onset_; }
  int64_t steps() const { return steps_; }

  void Next(int64_t step, StepData* d) {
    const int n = cell_.world;
    d->step = step;
    d->data.resize(n);
    d->comm.resize(n);
    for (auto& s : d->series) s.resize(n);
    const bool faulty = !cell_.healthy && step >= onset_;
    double max_busy = 0;
    for (int r = 0; r < n; ++r) {
      const bool slow = faulty && slow_[r];
      double compute = 0;
      for (int i = 0; i < kSections; ++i) {
        double v = kSectionBase[i] * (1 + cell_.noise * normal_(rng_));
        v = std::max(0.0, v) + (slow ? extra_[i] : 0);
        d->series[1 + i][r] = v;
        compute += v;
      }
      const double data = std::max(0.0, kDataBase * (1 + cell_.noise * normal_(rng_)));
      d->data[r] = data;
      d->series[kBusySeries][r] = data + compute;
      max_busy = std::max(max_busy, data + compute);
    }
    d->step_seconds = max_busy + kCollective;
    for (int r = 0; r < n; ++r) d->comm[r] = d->step_seconds - d->series[kBusySeries][r];
    now_ += static_cast<int64_t>(std::llround(d->step_seconds * 1e9));
    d->end_nanos = now_;
  }

 private:
  Cell cell_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0, 1};
  std::vector<char> slow_;
  std::array<double, kSections> extra_;
  int64_t onset_ = 0;
  int64_t steps_ = 0;
  int64_t now_ = kStartNanos;
};

// The median of v (reordered): the mean of the two middle values when even; `lower` takes the
// lower middle value instead (torch.median).
double Median(std::vector<double>& v, bool lower = false) {
  if (v.empty()) return 0;
  const size_t mid = lower ? (v.size() - 1) / 2 : v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (lower || v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + mid) + hi) / 2;
}

// ---- the detectors -------------------------------------------------------------------------

class GridDetector {
 public:
  virtual ~GridDetector() = default;
  // Takes one step of every rank. Returns whether the detector decided at this step (NVRx decides
  // only at its reports; its verdict stands in between), and then `flagged` gets the ranks it
  // flags (duplicates allowed).
  virtual bool Observe(const StepData& d, std::vector<int>* flagged) = 0;
};

class StepwatchDetector : public GridDetector {
 public:
  explicit StepwatchDetector(int world) {
    events_.resize(world);
    for (int r = 0; r < world; ++r) {
      an::StepEvent& e = events_[r];
      e.job = "grid";
      e.rank = r;
      e.world_size = world;
      e.node = "node-" + std::to_string(r / kRanksPerNode);
      for (const char* name : kSectionNames) e.sections.emplace_back(name, 0.0);
    }
  }

  bool Observe(const StepData& d, std::vector<int>* flagged) override {
    const double start = timed_ ? CpuSeconds() : 0;
    for (size_t r = 0; r < events_.size(); ++r) {
      an::StepEvent& e = events_[r];
      e.step = d.step;
      e.step_seconds = d.step_seconds;
      e.data_seconds = d.data[r];
      double compute = 0;
      for (int i = 0; i < kSections; ++i) {
        e.sections[i].second = d.series[1 + i][r];
        compute += d.series[1 + i][r];
      }
      e.compute_seconds = compute;
      e.comm_seconds = d.comm[r];
      e.received_unix_nanos = d.end_nanos;
      const absl::Status status = engine_.AddStep(e);
      if (!status.ok()) {
        std::cerr << "AddStep: " << status << "\n";
        std::exit(1);
      }
    }
    engine_.Advance(d.end_nanos);
    const double mid = timed_ ? CpuSeconds() : 0;
    for (const an::Finding& f : engine_.Findings()) {
      if (f.kind == an::FindingKind::kStraggler && f.rank >= 0) flagged->push_back(f.rank);
      if (f.kind == an::FindingKind::kSlowNode || f.kind == an::FindingKind::kPipelineImbalance) {
        flagged->insert(flagged->end(), f.ranks.begin(), f.ranks.end());
      }
    }
    if (timed_) {
      const double end = CpuSeconds();
      engine_seconds_ += mid - start;
      findings_seconds_ += end - mid;
    }
    return true;
  }

  // Whether the next steps are timed (a clock read costs about a microsecond here).
  void set_timed(bool timed) { timed_ = timed; }
  double engine_seconds() const { return engine_seconds_; }
  double findings_seconds() const { return findings_seconds_; }

 private:
  an::Engine engine_;
  std::vector<an::StepEvent> events_;
  bool timed_ = true;
  double engine_seconds_ = 0;
  double findings_seconds_ = 0;
};

// NVRx's relative and individual section scores (see the top of the file).
constexpr int kNvrxInterval = 16;
constexpr double kNvrxThreshold = 0.75;

class NvrxDetector : public GridDetector {
 public:
  explicit NvrxDetector(int world) : world_(world) {
    for (int s = 0; s < kSeries; ++s) {
      times_[s].assign(static_cast<size_t>(world) * kNvrxInterval, 0);
      best_[s].assign(world, std::numeric_limits<double>::infinity());
    }
    median_.resize(world);
  }

  bool Observe(const StepData& d, std::vector<int>* flagged) override {
    for (int s = 0; s < kSeries; ++s) {
      for (int r = 0; r < world_; ++r)
        times_[s][static_cast<size_t>(r) * kNvrxInterval + n_] = d.series[s][r];
    }
    if (++n_ < kNvrxInterval) return false;
    Report();
    flagged->insert(flagged->end(), stragglers_.begin(), stragglers_.end());
    return true;
  }

 private:
  void Report() {
    std::vector<char> flag(world_, 0);
    for (int s = 0; s < kSeries; ++s) {
      double fastest = std::numeric_limits<double>::infinity();
      for (int r = 0; r < world_; ++r) {
        const double* t = &times_[s][static_cast<size_t>(r) * kNvrxInterval];
        scratch_.assign(t, t + n_);
        median_[r] = Median(scratch_, /*lower=*/true);
        fastest = std::min(fastest, median_[r]);
      }
      for (int r = 0; r < world_; ++r) {
        best_[s][r] = std::min(best_[s][r], median_[r]);
        if (median_[r] <= 0) continue;
        const double relative = fastest / median_[r];
        const double individual = best_[s][r] / median_[r];
        if (relative < kNvrxThreshold || individual < kNvrxThreshold) flag[r] = 1;
      }
    }
    stragglers_.clear();
    for (int r = 0; r < world_; ++r) {
      if (flag[r]) stragglers_.push_back(r);
    }
    n_ = 0;
  }

  int world_;
  int n_ = 0;
  std::array<std::vector<double>, kSeries> times_;  // [rank * interval + i]
  std::array<std::vector<double>, kSeries> best_;
  std::vector<double> median_, scratch_;
  std::vector<int> stragglers_;
};

// Median + MAD across ranks of each rank's 16-step mean.
constexpr int kMadWindow = 16;
constexpr double kMadK = 3;
constexpr double kMadToSigma = 1.4826;
constexpr double kMadMinRelative = 0.05;

class MadDetector : public GridDetector {
 public:
  explicit MadDetector(int world) : world_(world) {
    for (int s = 0; s < kSeries; ++s) {
      ring_[s].assign(static_cast<size_t>(world) * kMadWindow, 0);
      sum_[s].assign(world, 0);
    }
    mean_.resize(world);
    flag_.resize(world);
  }

  bool Observe(const StepData& d, std::vector<int>* flagged) override {
    const size_t slot = static_cast<size_t>(count_ % kMadWindow) * world_;
    for (int s = 0; s < kSeries; ++s) {
      for (int r = 0; r < world_; ++r) {
        double& old = ring_[s][slot + r];
        sum_[s][r] += d.series[s][r] - old;
        old = d.series[s][r];
      }
    }
    if (++count_ < kMadWindow) return true;  // flags nothing yet
    std::fill(flag_.begin(), flag_.end(), 0);
    for (int s = 0; s < kSeries; ++s) {
      for (int r = 0; r < world_; ++r) mean_[r] = sum_[s][r] / kMadWindow;
      scratch_ = mean_;
      const double med = Median(scratch_);
      for (double& v : scratch_) v = std::fabs(v - med);
      const double mad = Median(scratch_);
      const double limit = std::max(med + kMadK * kMadToSigma * mad, med * (1 + kMadMinRelative));
      for (int r = 0; r < world_; ++r) {
        if (mean_[r] > limit) flag_[r] = 1;
      }
    }
    for (int r = 0; r < world_; ++r) {
      if (flag_[r]) flagged->push_back(r);
    }
    return true;
  }

 private:
  int world_;
  int64_t count_ = 0;
  std::array<std::vector<double>, kSeries> ring_;  // [slot * world + rank]
  std::array<std::vector<double>, kSeries> sum_;
  std::vector<double> mean_, scratch_;
  std::vector<char> flag_;
};

// The oracle CUSUM's false-alarm budget: one false alarm per 1/alpha steps over the whole job.
constexpr double kOracleAlpha = 1e-7;
constexpr double kPi = 3.14159265358979323846;

// What the oracle knows of a cell: the series the fault is in, the true relative effect on it and
// the true sd of a rank's per-step relative excess over the healthy ranks' median.
struct OracleModel {
  int series = kBusySeries;
  double drift = 0;  // relative effect
  double sd = 0;
  double h = 0;

  // Steps the CUSUM needs on average (Wald's approximation, overshoot ignored).
  double ExpectedSteps() const {
    const double d = drift / sd;
    return h / (d * d / 2);
  }
};

OracleModel OracleOf(const Cell& c) {
  OracleModel m;
  m.series = c.backward ? kBackwardSeries : kBusySeries;
  double base = 0, sd = 0;
  if (c.backward) {
    base = kSectionBase[kBackward];
    sd = c.noise * base;
  } else {
    base = kBusyBase;
    double var = kDataBase * kDataBase;
    for (double b : kSectionBase) var += b * b;
    sd = c.noise * std::sqrt(var);
  }
  // Healthy cells: the drift of a 10% fault, to show the oracle's false alarms at its threshold.
  const double effect = c.healthy ? 0.10 : c.effect;
  m.drift = effect * kNominalStep / base;
  // The reference is the median of the healthy ranks: the mean of two, the one alone, else about
  // pi / (2 n) times a rank's variance.
  const int healthy = c.world - (c.healthy ? 0 : c.slow);
  const double ref_var = healthy == 1 ? 1.0 : healthy == 2 ? 0.5 : kPi / (2.0 * healthy);
  m.sd = sd / base * std::sqrt(1 + ref_var);
  m.h = std::log(static_cast<double>(c.world)) + std::log(1 / kOracleAlpha);
  return m;
}

class OracleDetector : public GridDetector {
 public:
  OracleDetector(const Cell& cell, const std::vector<char>& slow, int64_t onset)
      : model_(OracleOf(cell)), slow_(slow), onset_(onset), stat_(cell.world, 0) {}

  bool Observe(const StepData& d, std::vector<int>* flagged) override {
    const std::vector<double>& v = d.series[model_.series];
    const int world = static_cast<int>(v.size());
    // Before the onset every rank is healthy.
    scratch_.clear();
    for (int r = 0; r < world; ++r) {
      if (!slow_[r] || d.step < onset_) scratch_.push_back(v[r]);
    }
    const double ref = Median(scratch_);
    if (ref <= 0) return true;
    const double dz = model_.drift / model_.sd;
    for (int r = 0; r < world; ++r) {
      const double z = (v[r] / ref - 1) / model_.sd;
      double& s = stat_[r];
      s = std::max(0.0, s + dz * z - dz * dz / 2);
      if (s > model_.h) flagged->push_back(r);
    }
    return true;
  }

 private:
  OracleModel model_;
  std::vector<char> slow_;
  int64_t onset_;
  std::vector<double> stat_;
  std::vector<double> scratch_;
};

// ---- scoring ---------------------------------------------------------------------------------

enum Det { kStepwatch, kNvrx, kMad, kOracle, kDetectors };
constexpr std::array<const char*, kDetectors> kDetNames = {"stepwatch", "nvrx", "mad", "oracle"};

struct Score {
  int64_t slow_ranks = 0;
  int64_t detected = 0;
  int64_t false_ranks = 0;     // ranks flagged while healthy, per seed, summed
  int64_t false_episodes = 0;  // runs of consecutive flagged steps of healthy ranks
  std::vector<int64_t> steps;  // onset to the first flag, per detected slow rank

  double Recall() const { return slow_ranks ? static_cast<double>(detected) / slow_ranks : 0; }
  // -1 when nothing was detected.
  double MedianSteps() const {
    if (steps.empty()) return -1;
    std::vector<double> v(steps.begin(), steps.end());
    return Median(v);
  }
};

// Follows one detector over one run.
class Tracker {
 public:
  Tracker(const std::vector<char>& slow, int64_t onset)
      : slow_(slow),
        onset_(onset),
        first_(slow.size(), -1),
        false_(slow.size(), 0),
        last_(slow.size(), std::numeric_limits<int64_t>::min()) {}

  // The ranks flagged by a decision at `step` (nothing when the detector did not decide then).
  // A slow rank counts as detected at the first decision from its onset on that flags it.
  void Observe(int64_t step, bool decided, const std::vector<int>& flagged) {
    if (!decided) return;
    for (int r : flagged) {
      if (r < 0 || static_cast<size_t>(r) >= slow_.size() || last_[r] == step) continue;
      // A new episode unless the rank was flagged at the detector's previous decision.
      const bool edge = last_[r] != last_decision_;
      last_[r] = step;
      if (slow_[r] && step >= onset_) {
        if (first_[r] < 0) first_[r] = step;
      } else {
        false_[r] = 1;
        if (edge) ++false_episodes_;
      }
    }
    last_decision_ = step;
  }

  void AddTo(Score* s) const {
    for (size_t r = 0; r < slow_.size(); ++r) {
      s->false_ranks += false_[r];
      if (!slow_[r]) continue;
      ++s->slow_ranks;
      if (first_[r] < 0) continue;
      ++s->detected;
      s->steps.push_back(first_[r] - onset_ + 1);
    }
    s->false_episodes += false_episodes_;
  }

 private:
  std::vector<char> slow_;
  int64_t onset_;
  std::vector<int64_t> first_;
  std::vector<char> false_;
  std::vector<int64_t> last_;
  int64_t last_decision_ = std::numeric_limits<int64_t>::min();
  int64_t false_episodes_ = 0;
};

struct CellResult {
  Cell cell;
  std::array<Score, kDetectors> score;
  int64_t rank_steps = 0;
  // CPU seconds, over the timed steps (timed_steps of them, timed_rank_steps rank-steps): of the
  // engine (AddStep and Advance), of Findings(), of each detector and (last) of making the draws.
  int64_t timed_steps = 0;
  int64_t timed_rank_steps = 0;
  double engine_seconds = 0;
  double findings_seconds = 0;
  std::array<double, kDetectors + 1> cpu_seconds{};
};

// One step in kTimingEvery is timed (all of them in short runs); 7 is prime to the reference
// detectors' 16-step windows, so their report steps are sampled at their share.
constexpr int kTimingEvery = 7;

CellResult RunCell(const Cell& cell) {
  CellResult out;
  out.cell = cell;
  StepData d;
  std::vector<int> flagged;
  for (int rep = 0; rep < cell.seeds; ++rep) {
    Draw draw(cell, rep);
    auto sw = std::make_unique<StepwatchDetector>(cell.world);
    std::array<std::unique_ptr<GridDetector>, kDetectors> dets;
    StepwatchDetector* sw_ptr = sw.get();
    dets[kStepwatch] = std::move(sw);
    dets[kNvrx] = std::make_unique<NvrxDetector>(cell.world);
    dets[kMad] = std::make_unique<MadDetector>(cell.world);
    dets[kOracle] = std::make_unique<OracleDetector>(cell, draw.slow(), draw.onset());
    std::vector<Tracker> trackers(kDetectors, Tracker(draw.slow(), draw.onset()));
    for (int64_t step = 0; step < draw.steps(); ++step) {
      const bool timed = draw.steps() < 64 || step % kTimingEvery == kTimingEvery - 1;
      sw_ptr->set_timed(timed);
      double t = timed ? CpuSeconds() : 0;
      draw.Next(step, &d);
      for (int k = 0; k < kDetectors; ++k) {
        if (timed) {
          const double t_next = CpuSeconds();
          out.cpu_seconds[k == 0 ? kDetectors : k - 1] += t_next - t;
          t = t_next;
        }
        flagged.clear();
        const bool decided = dets[k]->Observe(d, &flagged);
        trackers[k].Observe(step, decided, flagged);
      }
      if (timed) {
        out.cpu_seconds[kDetectors - 1] += CpuSeconds() - t;
        ++out.timed_steps;
        out.timed_rank_steps += cell.world;
      }
    }
    for (int k = 0; k < kDetectors; ++k) trackers[k].AddTo(&out.score[k]);
    out.rank_steps += draw.steps() * cell.world;
    out.engine_seconds += sw_ptr->engine_seconds();
    out.findings_seconds += sw_ptr->findings_seconds();
  }
  return out;
}

// ---- verdicts --------------------------------------------------------------------------------

// Why stepwatch does worse than `peer` in a cell (empty: it does at least as well). More false
// flags always count. Recall and steps count only against a peer with no more false flags than
// stepwatch (a detector that flags every rank has full recall at its first look: that is not a
// better detector), and steps only at equal recall (medians over different sets of ranks do not
// compare).
std::vector<std::string> Losses(const Score& sw, const Score& peer, const char* name) {
  std::vector<std::string> out;
  char buf[200];
  if (sw.false_ranks > peer.false_ranks) {
    std::snprintf(buf, sizeof buf,
                  "%s has fewer false flags (stepwatch %" PRId64 ", %s %" PRId64 ")", name,
                  sw.false_ranks, name, peer.false_ranks);
    out.push_back(buf);
    return out;
  }
  if (peer.false_ranks > sw.false_ranks) return out;
  if (peer.detected > sw.detected) {
    std::snprintf(buf, sizeof buf,
                  "%s has higher recall (stepwatch %.2f, %s %.2f: %" PRId64 " vs %" PRId64
                  " slow ranks)",
                  name, sw.Recall(), name, peer.Recall(), sw.detected, peer.detected);
    out.push_back(buf);
  } else if (peer.detected == sw.detected && sw.detected > 0 &&
             peer.MedianSteps() < sw.MedianSteps()) {
    std::snprintf(buf, sizeof buf, "%s is faster (median steps: stepwatch %g, %s %g)", name,
                  sw.MedianSteps(), name, peer.MedianSteps());
    out.push_back(buf);
  }
  return out;
}

std::string CellKey(const Cell& c) {
  std::ostringstream o;
  o << "world " << c.world << ", slow " << SlowLabel(c) << ", effect " << Percent(c.effect)
    << ", noise " << Percent(c.noise) << ", onset " << (c.mid ? "mid" : "0") << ", "
    << (c.backward ? "backward" : "spread");
  return o.str();
}

std::string Fmt(const Score& s) {
  char buf[64];
  const double m = s.MedianSteps();
  if (m < 0) {
    std::snprintf(buf, sizeof buf, "%.2f / %" PRId64 " / -", s.Recall(), s.false_ranks);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f / %" PRId64 " / %g", s.Recall(), s.false_ranks, m);
  }
  return buf;
}

// ---- the grid --------------------------------------------------------------------------------

std::vector<Cell> Grid(bool quick, int only_world) {
  const std::vector<int> worlds =
      quick ? std::vector<int>{4, 64} : std::vector<int>{2, 4, 64, 1024};
  const std::vector<double> effects =
      quick ? std::vector<double>{0.10, 0.30} : std::vector<double>{0.05, 0.10, 0.17, 0.30, 0.50};
  const std::vector<double> noises =
      quick ? std::vector<double>{0.05, 0.17} : std::vector<double>{0.01, 0.05, 0.17, 0.30};
  std::vector<Cell> cells;
  for (int world : worlds) {
    if (only_world > 0 && world != only_world) continue;
    std::vector<int> counts;
    for (int n : {1, 2, world / 4, world / 2}) {
      // All ranks slow, or none, has no healthy reference; repeated counts run once.
      if (n < 1 || n >= world) continue;
      if (std::find(counts.begin(), counts.end(), n) == counts.end()) counts.push_back(n);
    }
    for (int slow : counts) {
      for (double effect : effects) {
        for (double noise : noises) {
          for (bool mid : {false, true}) {
            for (bool backward : {false, true}) {
              Cell c;
              c.world = world;
              c.slow = slow;
              c.effect = effect;
              c.noise = noise;
              c.mid = mid;
              c.backward = backward;
              c.seeds = world >= 1024 ? 2 : 5;
              // Long enough for the oracle to detect (twice its expected steps), 400 at least.
              const double need = 2 * OracleOf(c).ExpectedSteps();
              c.horizon = static_cast<int64_t>(std::clamp(std::ceil(need), 400.0, 1500.0));
              cells.push_back(c);
            }
          }
        }
      }
    }
  }
  return cells;
}

struct HealthyRun {
  int world;
  int64_t steps;
  double noise;
};

std::vector<HealthyRun> HealthyRuns(bool quick, int only_world) {
  std::vector<HealthyRun> runs;
  for (double noise : {0.05, 0.20}) {
    if (quick) {
      runs.push_back({8, 12'500, noise});
      runs.push_back({64, 1'600, noise});
    } else {
      runs.push_back({8, 125'000, noise});
      runs.push_back({1024, 1'000, noise});
    }
  }
  if (!quick) runs.push_back({100'000, 20, 0.05});  // the engine's cost at its largest job
  std::vector<HealthyRun> out;
  for (const HealthyRun& r : runs) {
    if (only_world <= 0 || r.world == only_world) out.push_back(r);
  }
  return out;
}

// Whether a peer beats stepwatch on any figure of a cell, false flags aside: the literal reading
// ("lower recall than either, more false flags than either, more median steps than either").
bool LiteralLoss(const Score& sw, const Score& peer) {
  if (sw.false_ranks > peer.false_ranks || peer.detected > sw.detected) return true;
  return sw.detected > 0 && peer.detected > 0 && peer.MedianSteps() < sw.MedianSteps();
}

std::string Printf(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Printf(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

struct Report {
  std::string markdown;
  int losses = 0;
  int64_t healthy_stepwatch_false = 0;
  std::vector<std::string> loss_lines;
};

Report Render(const std::vector<CellResult>& results, const std::vector<CellResult>& healthy,
              bool quick, double grid_wall_s, double healthy_wall_s) {
  Report rep;
  std::ostringstream md;
  md << "## Straggler detection grid" << (quick ? " (--quick)" : "") << "\n\n"
     << "Each detector column: recall / false flags / median steps to detection (- when nothing "
        "was detected). `steps`: the run's length after the onset. `sw >= peers`: stepwatch has "
        "no more false flags than nvrx and mad, and no lower recall nor (at equal recall) more "
        "median steps than either of them that has no more false flags than stepwatch. "
        "`sw/oracle`: stepwatch's median steps over the oracle's.\n\n"
     << "| world | slow | effect | noise | onset | where | seeds | steps | stepwatch | nvrx | mad "
        "| oracle | sw >= peers | sw/oracle |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<std::string> slow_lines, miss_lines, bought_lines;
  std::map<int, std::array<int, 3>> by_world;  // cells, wins, literal wins
  int literal_losses = 0;
  int64_t rank_steps = 0, timed_rank_steps = 0;
  std::array<double, kDetectors + 1> cpu{};
  for (const CellResult& r : results) {
    const Score& sw = r.score[kStepwatch];
    const Score& oracle = r.score[kOracle];
    const std::string key = CellKey(r.cell);
    std::vector<std::string> why = Losses(sw, r.score[kNvrx], "nvrx");
    for (const std::string& s : Losses(sw, r.score[kMad], "mad")) why.push_back(s);
    for (int k : {kNvrx, kMad}) {
      const Score& p = r.score[k];
      if (p.detected > sw.detected && p.false_ranks > sw.false_ranks) {
        bought_lines.push_back(key + Printf(": %s recall %.2f with %" PRId64
                                            " false flags (stepwatch %.2f with %" PRId64 ")",
                                            kDetNames[k], p.Recall(), p.false_ranks, sw.Recall(),
                                            sw.false_ranks));
      }
    }
    const bool literal = LiteralLoss(sw, r.score[kNvrx]) || LiteralLoss(sw, r.score[kMad]);
    literal_losses += literal ? 1 : 0;
    const bool ok = why.empty();
    auto& w = by_world[r.cell.world];
    ++w[0];
    w[1] += ok ? 1 : 0;
    w[2] += literal ? 0 : 1;
    if (!ok) {
      ++rep.losses;
      std::string line = key + ": ";
      for (size_t i = 0; i < why.size(); ++i) line += (i ? "; " : "") + why[i];
      rep.loss_lines.push_back(line);
    }
    std::string ratio = "-";
    if (sw.MedianSteps() > 0 && oracle.MedianSteps() > 0) {
      const double q = sw.MedianSteps() / oracle.MedianSteps();
      ratio = Printf("%.2f", q);
      if (q > 1.5) {
        slow_lines.push_back(
            key + Printf(": %g vs %g steps (%.2fx)", sw.MedianSteps(), oracle.MedianSteps(), q));
      }
    }
    if (oracle.detected > 0 && sw.detected * 2 < oracle.detected) {
      miss_lines.push_back(
          key + Printf(": recall %.2f vs the oracle's %.2f", sw.Recall(), oracle.Recall()));
    }
    rank_steps += r.rank_steps;
    timed_rank_steps += r.timed_rank_steps;
    for (int k = 0; k <= kDetectors; ++k) cpu[k] += r.cpu_seconds[k];
    md << "| " << r.cell.world << " | " << SlowLabel(r.cell) << " | " << Percent(r.cell.effect)
       << " | " << Percent(r.cell.noise) << " | " << (r.cell.mid ? "mid" : "0") << " | "
       << (r.cell.backward ? "backward" : "spread") << " | " << r.cell.seeds << " | "
       << r.cell.horizon << " | " << Fmt(sw) << " | " << Fmt(r.score[kNvrx]) << " | "
       << Fmt(r.score[kMad]) << " | " << Fmt(oracle) << " | " << (ok ? "yes" : "no") << " | "
       << ratio << " |\n";
  }

  md << "\n## Healthy run: false flags and engine cost\n\n"
     << "False flags: ranks flagged at any time (in parentheses: episodes, runs of consecutive "
        "flagged steps). Engine: CPU time of AddStep for every rank and Advance, per rank-step; "
        "Findings(): CPU time per step.\n\n"
     << "| world | steps | noise | rank-steps | stepwatch | nvrx | mad | oracle | engine "
        "ns/rank-step | Findings() us/step |\n"
     << "|---|---|---|---|---|---|---|---|---|---|\n";
  std::array<int64_t, kDetectors> healthy_false{};
  int64_t healthy_rank_steps = 0;
  for (const CellResult& r : healthy) {
    md << "| " << r.cell.world << " | " << r.cell.horizon << " | " << Percent(r.cell.noise) << " | "
       << r.rank_steps;
    for (int k = 0; k < kDetectors; ++k) {
      md << " | " << r.score[k].false_ranks << " (" << r.score[k].false_episodes << ")";
      healthy_false[k] += r.score[k].false_ranks;
    }
    healthy_rank_steps += r.rank_steps;
    md << Printf(" | %.0f | %.1f |\n",
                 1e9 * r.engine_seconds / std::max<int64_t>(1, r.timed_rank_steps),
                 1e6 * r.findings_seconds / std::max<int64_t>(1, r.timed_steps));
  }
  rep.healthy_stepwatch_false = healthy_false[kStepwatch];

  md << "\n## Summary\n\n"
     << "Cells: " << results.size() << "; stepwatch at least as good as both peers in "
     << results.size() - rep.loss_lines.size() << ", worse than a peer in " << rep.losses
     << " (read literally, better than both on every figure regardless of the peers' false "
        "flags: "
     << results.size() - literal_losses << " of " << results.size() << "). Healthy run ("
     << healthy_rank_steps << " rank-steps): false flags stepwatch " << healthy_false[kStepwatch]
     << ", nvrx " << healthy_false[kNvrx] << ", mad " << healthy_false[kMad] << ", oracle "
     << healthy_false[kOracle] << ".\n\n"
     << "| world | cells | sw >= peers | literally better on every figure |\n|---|---|---|---|\n";
  for (const auto& [world, w] : by_world) {
    md << "| " << world << " | " << w[0] << " | " << w[1] << " | " << w[2] << " |\n";
  }
  auto list = [&md](const std::string& title, const std::vector<std::string>& lines) {
    md << "\n### " << title << " (" << lines.size() << ")\n\n";
    for (const std::string& l : lines) md << "- " << l << "\n";
    if (lines.empty()) md << "none\n";
  };
  list("Cells where a reference detector does better than stepwatch", rep.loss_lines);
  list("Cells where stepwatch needs more than 1.5x the oracle's median steps", slow_lines);
  list("Cells where stepwatch finds fewer than half the slow ranks the oracle finds", miss_lines);
  list("Cells where a peer has higher recall than stepwatch but more false flags", bought_lines);
  const double rs = static_cast<double>(std::max<int64_t>(1, timed_rank_steps));
  md << Printf("\nGrid: %" PRId64
               " rank-steps, %.1f s wall; CPU per rank-step: draws %.0f ns, stepwatch "
               "%.0f ns, nvrx %.0f ns, mad %.0f ns, oracle %.0f ns. Healthy run: %.1f s wall.\n",
               rank_steps, grid_wall_s, 1e9 * cpu[kDetectors] / rs, 1e9 * cpu[kStepwatch] / rs,
               1e9 * cpu[kNvrx] / rs, 1e9 * cpu[kMad] / rs, 1e9 * cpu[kOracle] / rs,
               healthy_wall_s);
  rep.markdown = md.str();
  return rep;
}

bool WriteCsv(const std::string& path, const std::vector<CellResult>& results,
              const std::vector<CellResult>& healthy) {
  std::ofstream csv(path);
  csv << "run,world,slow,effect,noise,onset,where,seeds,steps,detector,slow_ranks,detected,"
         "recall,false_flags,false_episodes,median_steps\n";
  auto row = [&](const char* run, const CellResult& r) {
    for (int k = 0; k < kDetectors; ++k) {
      const Score& s = r.score[k];
      csv << run << "," << r.cell.world << "," << r.cell.slow << "," << r.cell.effect << ","
          << r.cell.noise << "," << (r.cell.mid ? "mid" : "0") << ","
          << (r.cell.healthy    ? "-"
              : r.cell.backward ? "backward"
                                : "spread")
          << "," << r.cell.seeds << "," << r.cell.horizon << "," << kDetNames[k] << ","
          << s.slow_ranks << "," << s.detected << "," << s.Recall() << "," << s.false_ranks << ","
          << s.false_episodes << "," << s.MedianSteps() << "\n";
    }
  };
  for (const CellResult& r : results) row("grid", r);
  for (const CellResult& r : healthy) row("healthy", r);
  csv.flush();
  return static_cast<bool>(csv);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, check = false;
  int only_world = 0;
  std::string csv_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--check") {
      check = true;
    } else if (arg == "--csv" && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (arg == "--world" && i + 1 < argc) {
      only_world = std::atoi(argv[++i]);
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<CellResult> results;
  for (const Cell& c : Grid(quick, only_world)) results.push_back(RunCell(c));
  const auto t1 = Clock::now();
  std::vector<CellResult> healthy;
  for (const HealthyRun& h : HealthyRuns(quick, only_world)) {
    Cell c;
    c.world = h.world;
    c.noise = h.noise;
    c.healthy = true;
    c.seeds = 1;
    c.horizon = h.steps;
    healthy.push_back(RunCell(c));
  }
  const auto t2 = Clock::now();
  const Report rep = Render(results, healthy, quick, std::chrono::duration<double>(t1 - t0).count(),
                            std::chrono::duration<double>(t2 - t1).count());
  std::cout << rep.markdown;
  if (!csv_path.empty() && !WriteCsv(csv_path, results, healthy)) {
    std::cerr << "cannot write " << csv_path << "\n";
    return 1;
  }
  if (check && (rep.losses > 0 || rep.healthy_stepwatch_false > 0)) {
    std::cerr << "check failed: stepwatch does worse than a reference detector in " << rep.losses
              << " cells and flags " << rep.healthy_stepwatch_false
              << " ranks in the healthy run\n";
    for (const std::string& l : rep.loss_lines) std::cerr << "  " << l << "\n";
    return 1;
  }
  return 0;
}
