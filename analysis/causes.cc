#include "analysis/causes.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stepwatch::analysis {
namespace {

// An SM clock under this share of its maximum is a slowdown.
constexpr double kLowClock = 0.95;
// A power draw at this share of its limit is at the cap.
constexpr double kAtPowerCap = 0.97;

bool LowClock(const GpuReading& x) {
  return x.sm_clock_mhz && x.sm_clock_max_mhz && *x.sm_clock_max_mhz > 0 &&
         *x.sm_clock_mhz < kLowClock * *x.sm_clock_max_mhz;
}

}  // namespace

void AddCause(Cause c, std::vector<Cause>* causes) {
  if (std::find(causes->begin(), causes->end(), c) == causes->end()) causes->push_back(c);
}

Evidence GpuSlowdowns(const GpuReading& x) {
  Evidence ev;
  const uint64_t mask = x.throttle_reasons.value_or(0);
  if (mask & (0x20ull | 0x40ull)) AddCause(Cause::kThermalThrottling, &ev.causes);
  if (mask & (0x4ull | 0x80ull)) AddCause(Cause::kPowerThrottling, &ev.causes);
  if (mask & 0x8ull) AddCause(Cause::kHardwareSlowdown, &ev.causes);
  const bool low_clock = LowClock(x);
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
      *x.power_watts >= kAtPowerCap * *x.power_limit_watts && !capped) {
    AddCause(Cause::kPowerThrottling, &ev.causes);
    ev.texts.push_back(
        absl::StrFormat("at power cap (%.0f of %.0f W)", *x.power_watts, *x.power_limit_watts));
  }
  return ev;
}

bool AtFullSpeed(const GpuReading& x) {
  const bool clocks_known = x.sm_clock_mhz.has_value() || x.throttle_reasons.has_value();
  return clocks_known && GpuSlowdowns(x).causes.empty();
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
