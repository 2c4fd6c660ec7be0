// The what-ifs taken together, as every rendering of them (explain, report, the HTML page) says it.
// Each fix removes a share of the step, 1 - 1/speedup; the shares are disjoint (imbalance, exposed
// communication, data), so all fixed: 1 / (1 - sum of shares), limited to what leaves the compute
// share (at least 5% of the step) in place.
#pragma once

#include <string>

#include "google/protobuf/map.h"

namespace stepwatch::ctl {

struct WhatIfSummary {
  double best_speedup = 1;      // the best single fix
  double combined_speedup = 1;  // all fixed
  bool combined_clamped = false;
  // The overlap what-if assumes every exposed communication second can hide behind compute.
  bool combined_is_upper_bound = false;
};

// `speedups`: what-if -> speed-up (ExplainResponse.whatif_speedup_ratio); `time_ratio`: the
// step's shares (ExplainResponse.time_ratio), of which "compute" bounds the combined gain.
WhatIfSummary SummarizeWhatIf(const google::protobuf::Map<std::string, double>& speedups,
                              const google::protobuf::Map<std::string, double>& time_ratio);

}  // namespace stepwatch::ctl
