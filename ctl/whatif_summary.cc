#include "ctl/whatif_summary.h"

#include <algorithm>
#include <cmath>

namespace stepwatch::ctl {

WhatIfSummary SummarizeWhatIf(const google::protobuf::Map<std::string, double>& speedups,
                              const google::protobuf::Map<std::string, double>& time_ratio) {
  WhatIfSummary s;
  // Each fix removes a share of the step (1 - 1/speedup); the shares are disjoint parts of the
  // breakdown (imbalance, exposed comm, data), so they add up.
  double removed = 0;
  for (const auto& [key, speedup] : speedups) {
    if (!std::isfinite(speedup) || speedup < 1) continue;
    s.best_speedup = std::max(s.best_speedup, speedup);
    removed += 1 - 1 / speedup;
    if (key == "overlap" && speedup > 1) s.combined_is_upper_bound = true;
  }
  // What remains is at least the compute share (when known), and never nothing.
  double max_removed = 0.95;
  if (auto it = time_ratio.find("compute"); it != time_ratio.end() && it->second > 0) {
    max_removed = std::min(max_removed, 1 - it->second);
  }
  if (removed > max_removed) {
    removed = max_removed;
    s.combined_clamped = true;
  }
  s.combined_speedup = std::max(s.best_speedup, 1 / (1 - removed));
  return s;
}

}  // namespace stepwatch::ctl
