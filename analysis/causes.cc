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

std::optional<double> SaturatedHostCpu(const std::map<std::string, HostSample>& hosts,
                                       const std::string& node, const EngineOptions& opt,
                                       double* median_out) {
  auto hit = hosts.find(node);
  if (hit == hosts.end() || !hit->second.cpu_utilization_ratio ||
      *hit->second.cpu_utilization_ratio < opt.host_cpu_saturated) {
    return std::nullopt;
  }
  std::vector<double> all;
  for (const auto& [name, host] : hosts) {
    if (host.cpu_utilization_ratio) all.push_back(*host.cpu_utilization_ratio);
  }
  std::nth_element(all.begin(), all.begin() + all.size() / 2, all.end());
  const double median = all[all.size() / 2];
  if (all.size() > 1 && *hit->second.cpu_utilization_ratio - median < opt.host_cpu_above_median) {
    return std::nullopt;
  }
  if (median_out != nullptr) *median_out = median;
  return *hit->second.cpu_utilization_ratio;
}

void SetGpuBusy(const GpuInfo& g, DeviceEvidence* dev) {
  if (!g.has_value) return;
  if (g.last.sm_activity_ratio) {
    dev->sm_activity_ratio = g.value;
  } else {
    dev->utilization_ratio = g.value;
  }
}

std::vector<Cause> DeviceCauses(const GpuInfo* g, const std::map<std::string, HostSample>& hosts,
                                const std::string& node, const EngineOptions& opt,
                                DeviceEvidence* dev) {
  std::vector<Cause> causes;
  dev->node = node;
  if (g != nullptr) {
    dev->gpu = g->last.index;
    causes = GpuSlowdowns(g->last, opt, dev);
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

bool IsDeviceCause(Cause c) {
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
