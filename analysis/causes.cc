#include "analysis/causes.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/finding.h"

namespace stepwatch::analysis {
namespace {

bool LowClock(const GpuReading& x, double low_clock_ratio) {
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

Evidence GpuSlowdowns(const GpuReading& x, const EngineOptions& opt) {
  Evidence ev;
  const uint64_t mask = x.throttle_reasons.value_or(0);
  if (mask & (0x20ull | 0x40ull)) AddCause(Cause::kThermalThrottling, &ev.causes);
  if (mask & (0x4ull | 0x80ull)) AddCause(Cause::kPowerThrottling, &ev.causes);
  if (mask & 0x8ull) AddCause(Cause::kHardwareSlowdown, &ev.causes);
  const bool low_clock = LowClock(x, opt.low_clock_ratio);
  if (low_clock && ev.causes.empty()) ev.causes.push_back(Cause::kLowClocks);
  std::string clock;
  if (low_clock) {
    clock = absl::StrFormat("SM clock %.0f of %.0f MHz", *x.sm_clock_mhz, *x.sm_clock_max_mhz);
  }
  const std::vector<std::string> reasons = DecodeThrottleReasons(mask);
  if (!clock.empty() && !reasons.empty()) {
    ev.texts.push_back(absl::StrCat(clock, ", ", absl::StrJoin(reasons, ", ")));
  } else if (!clock.empty()) {
    ev.texts.push_back(clock);
  } else if (!reasons.empty()) {
    ev.texts.push_back(absl::StrJoin(reasons, ", "));
  }
  const bool capped = std::find(reasons.begin(), reasons.end(), "power capping") != reasons.end();
  if (x.power_watts && x.power_limit_watts && *x.power_limit_watts > 0 &&
      *x.power_watts >= opt.power_cap_ratio * *x.power_limit_watts && !capped) {
    AddCause(Cause::kPowerThrottling, &ev.causes);
    ev.texts.push_back(
        absl::StrFormat("at power cap (%.0f of %.0f W)", *x.power_watts, *x.power_limit_watts));
  }
  return ev;
}

bool AtFullSpeed(const GpuReading& x, const EngineOptions& opt) {
  const bool clocks_known = x.sm_clock_mhz.has_value() || x.throttle_reasons.has_value();
  return clocks_known && GpuSlowdowns(x, opt).causes.empty();
}

std::optional<double> SaturatedHostCpu(const std::map<std::string, HostReading>& hosts,
                                       const std::string& node, const EngineOptions& opt) {
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
  return *hit->second.cpu_utilization_ratio;
}

Evidence DeviceEvidence(const GpuInfo* g, const std::map<std::string, HostReading>& hosts,
                        const std::string& node, const EngineOptions& opt) {
  Evidence ev;
  if (g != nullptr) {
    ev = GpuSlowdowns(g->last, opt);
    if (g->has_value && g->value < opt.underutil_threshold) {
      ev.texts.push_back(absl::StrCat("GPU utilization ", Percent(g->value)));
    }
  }
  if (std::optional<double> cpu = SaturatedHostCpu(hosts, node, opt)) {
    AddCause(Cause::kHostCpu, &ev.causes);
    ev.texts.push_back(absl::StrCat("host CPU ", Percent(*cpu)));
  }
  return ev;
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

std::string DeviceAction(Cause cause, const std::string& node, int gpu) {
  const std::string where = node.empty() ? std::string("its node") : node;
  const std::string device =
      gpu >= 0 ? absl::StrCat(where, " GPU ", gpu) : absl::StrCat(where, "'s GPUs");
  switch (cause) {
    case Cause::kThermalThrottling:
      return absl::StrCat("drain ", where, " or inspect ", device, ": cooling (fans, airflow)");
    case Cause::kPowerThrottling:
      return absl::StrCat("drain ", where, " or inspect ", device,
                          ": power limit and power supply");
    case Cause::kHardwareSlowdown:
      return absl::StrCat("drain ", where, " and inspect ", device,
                          " (hardware slowdown: power brake, faulty part)");
    case Cause::kLowClocks:
      return absl::StrCat("drain ", where, " or inspect ", device,
                          ": clock settings (application clocks, clock locks)");
    case Cause::kHostCpu:
      return absl::StrCat("drain ", where, " or inspect its host: CPU load (other processes, ",
                          "data-loader threads)");
    case Cause::kDataLoading:
      return absl::StrCat("more data-loader workers or faster storage on ", where);
    default:
      return absl::StrCat("drain ", where, " or inspect ", device, " and its host");
  }
}

std::string JobAction(Cause cause) {
  switch (cause) {
    case Cause::kExposedComm:
      return "overlap communication with compute (bucketed, asynchronous collectives) or check "
             "the network";
    case Cause::kImbalance:
      return "find the ranks the others wait for (stepwatchctl explain, flagged ranks) and fix or "
             "drain their nodes, or rebalance their work";
    case Cause::kDataLoading:
      return "more data-loader workers or faster storage";
    default:
      return "profile a step (no dominant loss in the step's split)";
  }
}

}  // namespace stepwatch::analysis
