// Cause attribution and advice: which slowdowns a GPU reading shows, and what an operator should
// do about each cause. Pure functions of their arguments.
#pragma once

#include <string>
#include <vector>

#include "analysis/engine.h"

namespace stepwatch::analysis {

// Causes with the evidence for them, rendered for humans (e.g. "SM clock 1410 of 1980 MHz,
// thermal throttling"). Either list may be longer: one text can back several causes.
struct Evidence {
  std::vector<Cause> causes;
  std::vector<std::string> texts;
};

// The slowdowns a GPU reading shows: throttle reasons, an SM clock well under its maximum, a power
// draw at its cap. Causes in order of how specific they are (thermal, power, hardware, then low
// clocks with no reason given).
Evidence GpuSlowdowns(const GpuReading& x);

// Whether a reading shows the GPU running at full speed: its clock or throttle reasons are known
// and none of GpuSlowdowns applies.
bool AtFullSpeed(const GpuReading& x);

// Whether `c` is about the device or host a rank runs on (a slower GPU or node), not its work.
bool IsDeviceCause(Cause c);

// Appends `c` unless present.
void AddCause(Cause c, std::vector<Cause>* causes);

// Advice for a slow rank, node or stage on `node` (GPU `gpu`, -1 when not about one GPU).
std::string DeviceAction(Cause cause, const std::string& node, int gpu);

// Advice for a job-wide finding (scaling efficiency, regression) from its dominant loss.
std::string JobAction(Cause cause);

}  // namespace stepwatch::analysis
