#include "sim/tracesim.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace stepwatch::sim {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// The healthy reference of a group of peers' levels (see the header).
double Reference(std::vector<double> levels, const SimOptions& o) {
  std::sort(levels.begin(), levels.end());
  const size_t n = levels.size();
  if (n <= 2) return levels.front();
  size_t best = 0;
  double best_gap = 0;
  for (size_t k = (n + 1) / 2; k < n; ++k) {
    if (levels[k - 1] <= 0) continue;
    const double gap = levels[k] / levels[k - 1] - 1;
    if (gap > best_gap) best_gap = gap, best = k;
  }
  if (best > 0 && best_gap > o.cluster_gap) {
    return Median(std::vector<double>(levels.begin(), levels.begin() + best));
  }
  return Median(levels);
}

// Step blocks of `window` (the last one absorbs a remainder shorter than half a window).
std::vector<std::pair<size_t, size_t>> Blocks(size_t steps, int window) {
  const size_t w = static_cast<size_t>(std::max(1, window));
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t b = 0; b < steps; b += w) out.emplace_back(b, std::min(steps, b + w));
  if (out.size() >= 2 && out.back().second - out.back().first < (w + 1) / 2) {
    out[out.size() - 2].second = out.back().second;
    out.pop_back();
  }
  return out;
}

bool ReadLine(std::ifstream& in, std::string* line) {
  return static_cast<bool>(std::getline(in, *line));
}

}  // namespace

const char* FixName(Fix fix) {
  switch (fix) {
    case Fix::kNone:
      return "none";
    case Fix::kStragglers:
      return "stragglers";
    case Fix::kOverlap:
      return "overlap";
    case Fix::kData:
      return "data";
    case Fix::kPipeline:
      return "pipeline";
  }
  return "?";
}

std::vector<std::vector<double>> StragglerScale(const std::vector<std::vector<double>>& busy,
                                                const SimOptions& o) {
  const size_t steps = busy.size();
  std::vector<std::vector<double>> scale(steps);
  for (size_t s = 0; s < steps; ++s) scale[s].assign(busy[s].size(), 1.0);
  if (steps == 0 || busy[0].size() < 2) return scale;
  const size_t peers = busy[0].size();
  const size_t w = std::min(steps, static_cast<size_t>(std::max(1, o.level_window)));
  std::vector<double> levels(peers);
  std::vector<size_t> healthy, slow;
  for (size_t s = 0; s < steps; ++s) {
    // The window of `w` steps centred on s (shifted inside the trace at its ends).
    const size_t b = std::min(s - std::min(s, w / 2), steps - w);
    for (size_t p = 0; p < peers; ++p) {
      std::vector<double> v;
      for (size_t k = b; k < b + w; ++k) v.push_back(busy[k][p]);
      levels[p] = Median(std::move(v));
    }
    const double ref = Reference(levels, o);
    healthy.clear();
    slow.clear();
    for (size_t p = 0; p < peers; ++p) {
      const double l = levels[p];
      const bool straggler =
          l > 0 && l > ref * (1 + o.straggler_margin) && l - ref > o.straggler_abs_seconds;
      (straggler ? slow : healthy).push_back(p);
    }
    if (healthy.empty()) continue;
    // A fixed straggler runs at the reference level and varies as a healthy rank does in the same
    // step: its busy time is the reference times one healthy peer's busy / level (the peer taken
    // in turn). The same step, because ranks slow down together: in PAI job 4 four of the five
    // fast workers are 15% over their level at once in 49 steps, where independent noise would
    // give 2.
    for (size_t p : slow) {
      const size_t h = healthy[(p + s) % healthy.size()];
      const double rel = levels[h] > 0 ? busy[s][h] / levels[h] : 1;
      scale[s][p] = busy[s][p] > 0 ? ref * rel / busy[s][p] : 1;
    }
  }
  return scale;
}

std::vector<double> ReplayDp(const DpTrace& t, Fix fix, const SimOptions& o) {
  std::vector<std::vector<double>> scale;
  if (fix == Fix::kStragglers) {
    std::vector<std::vector<double>> busy(t.rank_steps.size());
    for (size_t s = 0; s < t.rank_steps.size(); ++s) {
      for (const RankStep& r : t.rank_steps[s]) busy[s].push_back(r.busy());
    }
    scale = StragglerScale(busy, o);
  }
  std::vector<double> out;
  out.reserve(t.rank_steps.size());
  for (size_t s = 0; s < t.rank_steps.size(); ++s) {
    const std::vector<RankStep>& rs = t.rank_steps[s];
    double collective = rs.empty() ? 0 : rs[0].exposed_comm;
    for (const RankStep& r : rs) collective = std::min(collective, r.exposed_comm);
    collective = std::max(0.0, collective);
    double end = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      const RankStep& r = rs[i];
      double arrival = r.arrival();
      double rest = collective;
      switch (fix) {
        case Fix::kStragglers:
          arrival = r.busy() * scale[s][i] + r.other;
          break;
        case Fix::kData:
          arrival = r.compute + r.other;
          break;
        case Fix::kOverlap: {
          // Compute already overlapped by communication cannot hide more of it.
          const double hidden = r.comm >= 0 ? std::max(0.0, r.comm - r.exposed_comm) : 0;
          rest = std::max(0.0, collective - std::max(0.0, r.compute - hidden));
          break;
        }
        case Fix::kNone:
        case Fix::kPipeline:
          break;
      }
      end = std::max(end, arrival + rest);
    }
    out.push_back(end);
  }
  return out;
}

double OneFOneB(const std::vector<std::vector<double>>& fwd,
                const std::vector<std::vector<double>>& bwd, double p2p, double data0,
                std::vector<double>* stage_end) {
  const int p = static_cast<int>(fwd.size());
  if (p == 0) return 0;
  const int m = static_cast<int>(fwd[0].size());
  // Each stage's order of operations: (micro-batch, is backward).
  std::vector<std::vector<std::pair<int, bool>>> ops(p);
  for (int s = 0; s < p; ++s) {
    const int warm = std::min(p - 1 - s, m);
    for (int i = 0; i < warm; ++i) ops[s].emplace_back(i, false);
    for (int i = 0; i < m - warm; ++i) {
      ops[s].emplace_back(warm + i, false);
      ops[s].emplace_back(i, true);
    }
    for (int i = m - warm; i < m; ++i) ops[s].emplace_back(i, true);
  }
  constexpr double kNotYet = -1;
  std::vector<std::vector<double>> f_end(p, std::vector<double>(m, kNotYet));
  std::vector<std::vector<double>> b_end(p, std::vector<double>(m, kNotYet));
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  free_at[0] = data0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < ops[s].size()) {
        auto [mb, backward] = ops[s][next[s]];
        double ready = 0;
        if (!backward) {
          if (s > 0) {
            if (f_end[s - 1][mb] < 0) break;
            ready = f_end[s - 1][mb] + p2p;
          }
        } else if (s + 1 < p) {
          if (b_end[s + 1][mb] < 0) break;
          ready = b_end[s + 1][mb] + p2p;
        } else {
          if (f_end[s][mb] < 0) break;
          ready = f_end[s][mb];
        }
        const double start = std::max(free_at[s], ready);
        const double end = start + (backward ? bwd[s][mb] : fwd[s][mb]);
        (backward ? b_end : f_end)[s][mb] = end;
        free_at[s] = end;
        ++next[s];
        progress = true;
      }
    }
  }
  if (stage_end != nullptr) *stage_end = free_at;
  return *std::max_element(free_at.begin(), free_at.end());
}

std::vector<double> ReplayPipeline(const PipelineTrace& t, Fix fix, const SimOptions& o) {
  const int p = t.stages, d = t.replicas;
  // Stragglers: peers are one stage's ranks across the replicas.
  std::vector<std::vector<std::vector<double>>> scale(p);  // [stage][step][replica]
  if (fix == Fix::kStragglers) {
    for (int s = 0; s < p; ++s) {
      std::vector<std::vector<double>> busy(t.rank_steps.size());
      for (size_t k = 0; k < t.rank_steps.size(); ++k) {
        for (int r = 0; r < d; ++r) {
          const StageStep& x = t.rank_steps[k][r * p + s];
          busy[k].push_back(Sum(x.fwd) + Sum(x.bwd) + x.data);
        }
      }
      scale[s] = StragglerScale(busy, o);
    }
  }
  // Pipeline balanced: each stage's share of the work, per block of `level_window` steps (the
  // median over the replicas of its ranks' forward + backward level, against the mean over the
  // stages); every rank's durations are divided by its stage's share, so each rank keeps its own
  // speed.
  std::vector<std::vector<double>> work(t.rank_steps.size(), std::vector<double>(p, 1.0));
  if (fix == Fix::kPipeline) {
    for (auto [b, e] : Blocks(t.rank_steps.size(), o.level_window)) {
      std::vector<double> stage(p);
      for (int s = 0; s < p; ++s) {
        std::vector<double> levels;
        for (int r = 0; r < d; ++r) {
          std::vector<double> v;
          for (size_t k = b; k < e; ++k) {
            const StageStep& x = t.rank_steps[k][r * p + s];
            v.push_back(Sum(x.fwd) + Sum(x.bwd));
          }
          levels.push_back(Median(std::move(v)));
        }
        stage[s] = Median(std::move(levels));
      }
      const double mean = Sum(stage) / p;
      for (size_t k = b; k < e; ++k) {
        for (int s = 0; s < p; ++s) work[k][s] = mean > 0 && stage[s] > 0 ? stage[s] / mean : 1;
      }
    }
  }
  std::vector<double> out;
  for (size_t k = 0; k < t.rank_steps.size(); ++k) {
    double makespan = 0, least_compute = -1;
    for (int r = 0; r < d; ++r) {
      std::vector<std::vector<double>> fwd(p), bwd(p);
      double data0 = 0;
      for (int s = 0; s < p; ++s) {
        const StageStep& x = t.rank_steps[k][r * p + s];
        const double f = fix == Fix::kStragglers ? scale[s][k][r] : 1.0;
        fwd[s] = x.fwd;
        bwd[s] = x.bwd;
        for (double& v : fwd[s]) v *= f;
        for (double& v : bwd[s]) v *= f;
        if (s == 0) data0 = fix == Fix::kData ? 0 : x.data * f;
        const double compute = Sum(fwd[s]) + Sum(bwd[s]);
        least_compute = least_compute < 0 ? compute : std::min(least_compute, compute);
      }
      if (fix == Fix::kPipeline) {
        for (int s = 0; s < p; ++s) {
          for (double& v : fwd[s]) v /= work[k][s];
          for (double& v : bwd[s]) v /= work[k][s];
        }
      }
      makespan = std::max(makespan, OneFOneB(fwd, bwd, t.p2p_seconds, data0));
    }
    double collective = t.collective[k];
    if (fix == Fix::kOverlap) collective = std::max(0.0, collective - std::max(0.0, least_compute));
    out.push_back(makespan + collective);
  }
  return out;
}

SimResult Simulate(const DpTrace& t, const SimOptions& o) {
  SimResult r;
  for (const std::vector<RankStep>& rs : t.rank_steps) {
    std::vector<double> v;
    for (const RankStep& x : rs) v.push_back(x.step);
    r.measured_seconds += Median(std::move(v));
  }
  r.replay_seconds = Sum(ReplayDp(t, Fix::kNone, o));
  auto speedup = [&](Fix f) {
    const double fixed = Sum(ReplayDp(t, f, o));
    return fixed > 0 ? std::max(1.0, r.replay_seconds / fixed) : 1.0;
  };
  r.stragglers = speedup(Fix::kStragglers);
  r.overlap = speedup(Fix::kOverlap);
  r.data = speedup(Fix::kData);
  return r;
}

SimResult Simulate(const PipelineTrace& t, const SimOptions& o) {
  SimResult r;
  r.replay_seconds = Sum(ReplayPipeline(t, Fix::kNone, o));
  r.measured_seconds = r.replay_seconds;  // generated: the replay is the measurement
  auto speedup = [&](Fix f) {
    const double fixed = Sum(ReplayPipeline(t, f, o));
    return fixed > 0 ? std::max(1.0, r.replay_seconds / fixed) : 1.0;
  };
  r.stragglers = speedup(Fix::kStragglers);
  r.overlap = speedup(Fix::kOverlap);
  r.data = speedup(Fix::kData);
  r.pipeline = speedup(Fix::kPipeline);
  return r;
}

absl::StatusOr<std::vector<DpTrace>> LoadKinetoSteps(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string line;
  constexpr absl::string_view kHeader =
      "trace,rank,world_size,step,step_s,data_s,compute_s,comm_s,exposed_comm_s,other_s";
  if (!ReadLine(in, &line) || absl::StripTrailingAsciiWhitespace(line) != kHeader) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected the header ", kHeader));
  }
  struct Rows {
    int world = 0;
    std::map<int, std::map<int64_t, RankStep>> by_rank;
  };
  std::vector<std::string> order;
  std::map<std::string, Rows> traces;
  for (int line_no = 2; ReadLine(in, &line); ++line_no) {
    absl::string_view text = absl::StripTrailingAsciiWhitespace(line);
    if (text.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(text, ',');
    int rank = 0, world = 0;
    int64_t step = 0;
    double v[6];
    bool ok = f.size() == 10 && !f[0].empty() && absl::SimpleAtoi(f[1], &rank) &&
              absl::SimpleAtoi(f[2], &world) && absl::SimpleAtoi(f[3], &step) && rank >= 0 &&
              world > rank;
    for (int i = 0; ok && i < 6; ++i) ok = absl::SimpleAtod(f[4 + i], &v[i]) && v[i] >= 0;
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": malformed row"));
    const std::string name(f[0]);
    if (!traces.count(name)) order.push_back(name);
    Rows& rows = traces[name];
    rows.world = std::max(rows.world, world);
    RankStep r;
    r.step = v[0];
    r.data = v[1];
    r.compute = v[2];
    r.comm = v[3];
    r.exposed_comm = v[4];
    r.other = v[5];
    rows.by_rank[rank].emplace(step, r);
  }
  std::vector<DpTrace> out;
  for (const std::string& name : order) {
    const Rows& rows = traces[name];
    DpTrace t;
    t.name = name;
    t.ranks = static_cast<int>(rows.by_rank.size());
    t.job_world_size = rows.world;
    for (const auto& [step, r0] : rows.by_rank.begin()->second) {
      std::vector<RankStep> rs;
      for (const auto& [rank, steps] : rows.by_rank) {
        auto it = steps.find(step);
        if (it == steps.end()) break;
        rs.push_back(it->second);
      }
      if (static_cast<int>(rs.size()) != t.ranks) continue;
      t.steps.push_back(step);
      t.rank_steps.push_back(std::move(rs));
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<DpTrace> LoadPaiTrace(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string line;
  if (!ReadLine(in, &line) ||
      absl::StripTrailingAsciiWhitespace(line) != ",worker,gpu,time,batch_time_norm") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected the header ,worker,gpu,time,batch_time_norm"));
  }
  std::map<int64_t, std::map<int, double>> by_step;  // step -> worker -> busy ms
  int max_worker = -1;
  for (int line_no = 2; ReadLine(in, &line); ++line_no) {
    absl::string_view text = absl::StripTrailingAsciiWhitespace(line);
    if (text.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(text, ',');
    int worker = 0;
    int64_t time = 0;
    double busy = 0;
    if (f.size() != 5 || !absl::SimpleAtoi(f[1], &worker) || !absl::SimpleAtoi(f[3], &time) ||
        !absl::SimpleAtod(f[4], &busy) || worker < 0 || worker > 100000 || time < 0 ||
        !(busy > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": malformed row"));
    }
    max_worker = std::max(max_worker, worker);
    by_step[time / 10].emplace(worker, busy);
  }
  DpTrace t;
  t.name = name;
  t.ranks = t.job_world_size = max_worker + 1;
  for (const auto& [step, rows] : by_step) {
    if (static_cast<int>(rows.size()) != t.ranks) continue;
    double step_ms = 0;
    for (const auto& [w, busy] : rows) step_ms = std::max(step_ms, busy);
    std::vector<RankStep> rs;
    for (const auto& [w, busy] : rows) {
      RankStep r;
      r.compute = busy / 1000;
      r.step = step_ms / 1000;
      r.exposed_comm = (step_ms - busy) / 1000;
      rs.push_back(r);
    }
    t.steps.push_back(step);
    t.rank_steps.push_back(std::move(rs));
  }
  return t;
}

namespace {

// Multiplicative noise of coefficient of variation `cv`, never under 0.2.
class Noise {
 public:
  explicit Noise(uint64_t seed) : rng_(seed) {}
  double operator()(double cv) { return std::max(0.2, 1 + cv * normal_(rng_)); }

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0, 1};
};

struct DpSpec {
  std::string name;
  int ranks = 16;
  int steps = 200;
  double compute = 0.30, data = 0.01, other = 0.005, collective = 0.08, hidden = 0.05;
  double cv = 0.02;
  int slow_rank = -1;
  double slow_factor = 1;
  int data_rank = -1;
  double data_stall = 0;
};

DpTrace MakeDp(const DpSpec& spec, uint64_t seed) {
  Noise noise(seed);
  DpTrace t;
  t.name = spec.name;
  t.ranks = t.job_world_size = spec.ranks;
  for (int s = 0; s < spec.steps; ++s) {
    std::vector<RankStep> rs(spec.ranks);
    double max_arrival = 0;
    for (int r = 0; r < spec.ranks; ++r) {
      RankStep& x = rs[r];
      x.compute = spec.compute * noise(spec.cv) * (r == spec.slow_rank ? spec.slow_factor : 1);
      x.data =
          spec.data * noise(spec.cv) + (r == spec.data_rank ? spec.data_stall * noise(0.1) : 0);
      x.other = spec.other * noise(spec.cv);
      max_arrival = std::max(max_arrival, x.arrival());
    }
    const double collective = spec.collective * noise(spec.cv);
    for (RankStep& x : rs) {
      x.exposed_comm = max_arrival - x.arrival() + collective;
      x.comm = x.exposed_comm + std::min(spec.hidden, x.compute);
      x.step = max_arrival + collective;
    }
    t.steps.push_back(s);
    t.rank_steps.push_back(std::move(rs));
  }
  return t;
}

struct PpSpec {
  std::string name;
  int stages = 4, replicas = 4, microbatches = 8, steps = 120;
  double fwd = 0.010, bwd = 0.020, p2p = 0.001, collective = 0.03, data = 0.002, cv = 0.02;
  int slow_stage = -1;
  double stage_factor = 1;
  int slow_rank = -1;
  double rank_factor = 1;
};

PipelineTrace MakePp(const PpSpec& spec, uint64_t seed) {
  Noise noise(seed);
  PipelineTrace t;
  t.name = spec.name;
  t.stages = spec.stages;
  t.replicas = spec.replicas;
  t.microbatches = spec.microbatches;
  t.p2p_seconds = spec.p2p;
  const int ranks = spec.stages * spec.replicas;
  for (int k = 0; k < spec.steps; ++k) {
    std::vector<StageStep> rs(ranks);
    for (int rank = 0; rank < ranks; ++rank) {
      const int s = rank % spec.stages;
      const double f = (s == spec.slow_stage ? spec.stage_factor : 1) *
                       (rank == spec.slow_rank ? spec.rank_factor : 1);
      StageStep& x = rs[rank];
      for (int mb = 0; mb < spec.microbatches; ++mb) {
        x.fwd.push_back(spec.fwd * f * noise(spec.cv));
        x.bwd.push_back(spec.bwd * f * noise(spec.cv));
      }
      if (s == 0) x.data = spec.data * noise(0.1);
    }
    t.steps.push_back(k);
    t.rank_steps.push_back(std::move(rs));
    t.collective.push_back(spec.collective * noise(spec.cv));
  }
  return t;
}

}  // namespace

std::vector<DpTrace> GeneratedDpTraces() {
  std::vector<DpTrace> out;
  DpSpec a;
  a.name = "gen-dp-straggler";  // one rank 30% slower in compute
  a.slow_rank = 5;
  a.slow_factor = 1.3;
  out.push_back(MakeDp(a, 11));
  DpSpec b;
  b.name = "gen-dp-data-straggler";  // one rank waits 0.15 s for input data each step
  b.data_rank = 9;
  b.data_stall = 0.15;
  out.push_back(MakeDp(b, 12));
  DpSpec c;
  c.name = "gen-dp-comm-heavy";  // 0.30 s collective against 0.12 s compute, 0.08 s of it hidden
  c.ranks = 8;
  c.compute = 0.12;
  c.collective = 0.30;
  c.hidden = 0.08;
  out.push_back(MakeDp(c, 13));
  return out;
}

std::vector<PipelineTrace> GeneratedPipelineTraces() {
  std::vector<PipelineTrace> out;
  PpSpec a;
  a.name = "gen-pp-imbalanced";  // stage 2 does 40% more work
  a.slow_stage = 2;
  a.stage_factor = 1.4;
  out.push_back(MakePp(a, 21));
  PpSpec b;
  b.name = "gen-pp-straggler";  // stage 1 of replica 2 runs 30% slower
  b.slow_rank = 2 * b.stages + 1;
  b.rank_factor = 1.3;
  out.push_back(MakePp(b, 22));
  PpSpec c;
  c.name = "gen-pp-data";  // stage 0 waits 40 ms for input before its first forward
  c.data = 0.04;
  out.push_back(MakePp(c, 23));
  return out;
}

}  // namespace stepwatch::sim
