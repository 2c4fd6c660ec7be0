// Cause attribution: which slowdowns a GPU reading and its host show, with the figures behind
// them. Pure functions of their arguments.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "analysis/health_tracker.h"
#include "analysis/registry.h"

namespace stepwatch::analysis {

// The slowdowns a GPU reading shows: throttle reasons, an SM clock well under its maximum, a power
// draw at its cap. Causes in order of how specific they are (thermal, power, hardware, then low
// clocks with no reason given). Sets the figures behind them on `dev` (null: only the causes).
std::vector<Cause> GpuSlowdowns(const GpuSample& x, const EngineOptions& opt, DeviceEvidence* dev);

// Whether a reading shows the GPU running at full speed: its clock or throttle reasons are known
// and none of GpuSlowdowns applies.
bool AtFullSpeed(const GpuSample& x, const EngineOptions& opt);

// The node's host CPU utilization when it is saturated and clearly busier than the median host:
// a busy CPU on every node (or several nodes sharing one host) explains no single slow rank.
// `median` (may be null) receives the median host's utilization.
std::optional<double> SaturatedHostCpu(const HostMap& hosts, const std::string& node,
                                       const EngineOptions& opt, double* median = nullptr);

// Causes read from a GPU's and its host's last readings: hardware faults of the GPU and the
// node's network ports first, then clocks, throttling, power, host CPU; a low GPU utilization is
// evidence (set on `dev`) without a cause of its own. `g` may be null.
std::vector<Cause> DeviceCauses(const GpuInfo* g, const HostMap& hosts, const std::string& node,
                                const EngineOptions& opt, DeviceEvidence* dev);

// Sets the GPU's busy figure on `dev`: SM activity where the reading has it, else utilization.
void SetGpuBusy(const GpuInfo& g, DeviceEvidence* dev);

// Whether a rank's GPU shows it doing more work than its peers rather than being slower: full
// clocks, no throttling, a busy GPU (and no saturated host, which DeviceEvidence would name).
bool FullSpeedAndBusy(const GpuInfo* g, const EngineOptions& opt);

// Whether `c` is about the device or host a rank runs on (a slower GPU or node), not its work.
bool IsDeviceCause(Cause c);

// Appends `c` unless present.
void AddCause(Cause c, std::vector<Cause>* causes);

// Whether `c` is a hardware fault of a GPU or a network port (HealthFault::cause).
bool IsHealthCause(Cause c);
// Adds the hardware faults (not an application's Xid, severity info) to `causes`, with their
// evidence on `dev`.
void AddHealthFaults(const std::vector<HealthFault>& faults, std::vector<Cause>* causes,
                     DeviceEvidence* dev);
// Moves the hardware faults to the front (the primary cause), keeping the order otherwise.
void HealthFirst(std::vector<Cause>* causes);

}  // namespace stepwatch::analysis
