// Helpers the parts of the trace-driven simulator share (sim/tracesim.cc, sim/tracesim_replay.cc):
// the median and the sum of a series of durations. Internal to the simulator.
#pragma once

#include <vector>

namespace stepwatch::sim::tracesim_internal {

// The median of `v` (the mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> v);
double Sum(const std::vector<double>& v);

}  // namespace stepwatch::sim::tracesim_internal
