// The replays of the trace-driven simulator (sim/tracesim.h): a data-parallel step as the slowest
// rank's arrival plus the collective, a pipeline step as the 1F1B makespan of each replica plus the
// gradient collective, each with one kind of slowness removed (Fix).
#include <algorithm>
#include <utility>
#include <vector>

#include "sim/tracesim.h"
#include "sim/tracesim_internal.h"

namespace stepwatch::sim {
namespace {

using tracesim_internal::Median;
using tracesim_internal::Sum;

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

}  // namespace

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

}  // namespace stepwatch::sim
