#include "analysis/causes.h"

#include <algorithm>

namespace stepwatch::analysis {
namespace {

bool LowClock(const GpuSample& x, double low_clock_ratio) {
  return x.sm_clock_mhz && x.sm_clock_max_mhz && *x.sm_clock_max_mhz > 0 &&
         *x.sm_clock_mhz < low_clock_ratio * *x.sm_clock_max_mhz;
}

}  // namespace

std::vector<std::string> DecodeThrottleReasons(uint64_t mask) {
  // NVML clocks-throttle-reason bits; idle, application clocks, sync boost and display clock
  // settings are not slowdowns and are left out.
  std::vector<std::string> out;
  auto add = [&out](const char* s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.emplace_back(s);
  };
  if (mask & 0x20ull || mask & 0x40ull) add("thermal throttling");
  if (mask & 0x4ull) add("power capping");
  if (mask & 0x80ull) add("power brake");
  if (mask & 0x8ull) add("hardware slowdown");
  return out;
}

void AddCause(Cause c, std::vector<Cause>* causes) {
  if (std::find(causes->begin(), causes->end(), c) == causes->end()) causes->push_back(c);
}

std::vector<Cause> GpuSlowdowns(const GpuSample& x, const EngineOptions& opt, DeviceEvidence* dev) {
  std::vector<Cause> causes;
  const uint64_t mask = x.throttle_reasons.value_or(0);
  if (mask & (0x20ull | 0x40ull)) AddCause(Cause::kThermalThrottling, &causes);
  if (mask & (0x4ull | 0x80ull)) AddCause(Cause::kPowerThrottling, &causes);
  if (mask & 0x8ull) AddCause(Cause::kHardwareSlowdown, &causes);
  const bool low_clock = LowClock(x, opt.low_clock_ratio);
  if (low_clock && causes.empty()) causes.push_back(Cause::kLowClocks);
  const bool capped = mask & 0x4ull;
  const bool at_cap = x.power_watts && x.power_limit_watts && *x.power_limit_watts > 0 &&
                      *x.power_watts >= opt.power_cap_ratio * *x.power_limit_watts;
  if (at_cap && !capped) AddCause(Cause::kPowerThrottling, &causes);
  if (dev == nullptr) return causes;
  if (low_clock) {
    dev->sm_clock_mhz = x.sm_clock_mhz;
    dev->sm_clock_max_mhz = x.sm_clock_max_mhz;
  }
  if (!DecodeThrottleReasons(mask).empty()) dev->throttle_reasons = mask;
  if (mask & (0x20ull | 0x40ull)) dev->temperature_celsius = x.temperature_celsius;
  if (at_cap) {
    dev->power_watts = x.power_watts;
    dev->power_limit_watts = x.power_limit_watts;
  }
  return causes;
}

bool AtFullSpeed(const GpuSample& x, const EngineOptions& opt) {
  const bool clocks_known = x.sm_clock_mhz.has_value() || x.throttle_reasons.has_value();
  return clocks_known && GpuSlowdowns(x, opt, nullptr).empty();
}

std::optional<double> SaturatedHostCpu(const HostMap& hosts, const std::string& node,
                                       const EngineOptions& opt, double* median_out) {
  auto hit = hosts.find(node);
  if (hit == hosts.end() || !hit->second.last.cpu_utilization_ratio ||
      *hit->second.last.cpu_utilization_ratio < opt.host_cpu_saturated) {
    return std::nullopt;
  }
  std::vector<double> all;
  for (const auto& [name, host] : hosts) {
    if (host.last.cpu_utilization_ratio) all.push_back(*host.last.cpu_utilization_ratio);
  }
  std::nth_element(all.begin(), all.begin() + all.size() / 2, all.end());
  const double median = all[all.size() / 2];
  if (all.size() > 1 &&
      *hit->second.last.cpu_utilization_ratio - median < opt.host_cpu_above_median) {
    return std::nullopt;
  }
  if (median_out != nullptr) *median_out = median;
  return *hit->second.last.cpu_utilization_ratio;
}

void SetGpuBusy(const GpuInfo& g, DeviceEvidence* dev) {
  if (!g.has_value) return;
  if (g.last.sm_activity_ratio) {
    dev->sm_activity_ratio = g.value;
  } else {
    dev->utilization_ratio = g.value;
  }
}

std::vector<Cause> DeviceCauses(const GpuInfo* g, const HostMap& hosts, const std::string& node,
                                const EngineOptions& opt, DeviceEvidence* dev) {
  std::vector<Cause> causes;
  dev->node = node;
  // Hardware faults first: they say why the clocks or the work look as they do.
  if (g != nullptr) AddHealthFaults(g->health.faults(), &causes, dev);
  if (auto host = hosts.find(node); host != hosts.end()) {
    AddHealthFaults(host->second.nics.faults(), &causes, dev);
  }
  if (g != nullptr) {
    dev->gpu = g->last.index;
    for (Cause c : GpuSlowdowns(g->last, opt, dev)) AddCause(c, &causes);
    if (g->has_value && g->value < opt.underutil_threshold) SetGpuBusy(*g, dev);
  }
  double median = 0;
  if (std::optional<double> cpu = SaturatedHostCpu(hosts, node, opt, &median)) {
    AddCause(Cause::kHostCpu, &causes);
    dev->host_cpu_ratio = cpu;
    dev->host_cpu_median_ratio = median;
  }
  return causes;
}

bool FullSpeedAndBusy(const GpuInfo* g, const EngineOptions& opt) {
  return g != nullptr && AtFullSpeed(g->last, opt) && g->has_value &&
         g->value >= opt.underutil_threshold;
}

bool IsHealthCause(Cause c) {
  switch (c) {
    case Cause::kXid:
    case Cause::kEccUncorrected:
    case Cause::kRowRemapPending:
    case Cause::kRowRemapFailure:
    case Cause::kNvlinkDown:
    case Cause::kNvlinkErrors:
    case Cause::kPcieDowngraded:
    case Cause::kPcieReplays:
    case Cause::kNicDown:
    case Cause::kNicDegraded:
    case Cause::kNicErrors:
      return true;
    default:
      return false;
  }
}

void AddHealthFaults(const std::vector<HealthFault>& faults, std::vector<Cause>* causes,
                     DeviceEvidence* dev) {
  for (const HealthFault& f : faults) {
    if (f.severity == Severity::kInfo) continue;
    AddCause(f.cause, causes);
    dev->health.push_back(f.evidence);
  }
}

void HealthFirst(std::vector<Cause>* causes) {
  std::stable_partition(causes->begin(), causes->end(), IsHealthCause);
}

bool IsDeviceCause(Cause c) {
  if (IsHealthCause(c)) return true;
  switch (c) {
    case Cause::kThermalThrottling:
    case Cause::kPowerThrottling:
    case Cause::kHardwareSlowdown:
    case Cause::kLowClocks:
    case Cause::kHostCpu:
      return true;
    default:
      return false;
  }
}

}  // namespace stepwatch::analysis
