// The what-ifs of the trace-driven simulator (sim/tracesim.h): which ranks of a group of peers are
// stragglers and how fast they would run as healthy ones, and each fix's speed-up over the replay
// with nothing fixed. The replays are in sim/tracesim_replay.cc, the loaders of the committed
// traces in sim/tracesim_load.cc and the generated traces in sim/tracesim_generated.cc.
#include "sim/tracesim.h"

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "sim/tracesim_internal.h"

namespace stepwatch::sim {
namespace tracesim_internal {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

}  // namespace tracesim_internal

namespace {

using tracesim_internal::Median;
using tracesim_internal::Sum;

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
SimResult Simulate(const DpTrace& t, const SimOptions& o) {
  SimResult r;
  for (const std::vector<RankStep>& rs : t.rank_steps) {
    std::vector<double> v;
    v.reserve(rs.size());
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
}  // namespace stepwatch::sim
