// Cause attribution and advice: which slowdowns a GPU reading shows, and what an operator should
// do about each cause. Pure functions of their arguments.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "analysis/registry.h"

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
Evidence GpuSlowdowns(const GpuReading& x, const EngineOptions& opt);

// Whether a reading shows the GPU running at full speed: its clock or throttle reasons are known
// and none of GpuSlowdowns applies.
bool AtFullSpeed(const GpuReading& x, const EngineOptions& opt);

// The node's host CPU utilization when it is saturated and clearly busier than the median host:
// a busy CPU on every node (or several nodes sharing one host) explains no single slow rank.
std::optional<double> SaturatedHostCpu(const std::map<std::string, HostReading>& hosts,
                                       const std::string& node, const EngineOptions& opt);

// Causes read from a GPU's and its host's last readings: clocks, throttling, power, host CPU;
// a low GPU utilization is evidence (a text) without a cause of its own. `g` may be null.
Evidence DeviceEvidence(const GpuInfo* g, const std::map<std::string, HostReading>& hosts,
                        const std::string& node, const EngineOptions& opt);

// Whether a rank's GPU shows it doing more work than its peers rather than being slower: full
// clocks, no throttling, a busy GPU (and no saturated host, which DeviceEvidence would name).
bool FullSpeedAndBusy(const GpuInfo* g, const EngineOptions& opt);

// Whether `c` is about the device or host a rank runs on (a slower GPU or node), not its work.
bool IsDeviceCause(Cause c);

// Appends `c` unless present.
void AddCause(Cause c, std::vector<Cause>* causes);

// Advice for a slow rank, node or stage on `node` (GPU `gpu`, -1 when not about one GPU).
std::string DeviceAction(Cause cause, const std::string& node, int gpu);

// Advice for a job-wide finding (scaling efficiency, regression) from its dominant loss.
std::string JobAction(Cause cause);

}  // namespace stepwatch::analysis
