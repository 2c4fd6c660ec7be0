#include "analysis/finding.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace stepwatch::analysis {

const char* FindingKindName(FindingKind kind) {
  switch (kind) {
    case FindingKind::kStraggler:
      return "straggler";
    case FindingKind::kSlowNode:
      return "slow_node";
    case FindingKind::kPipelineImbalance:
      return "pipeline_imbalance";
    case FindingKind::kUnderutilizedGpu:
      return "underutilized_gpu";
    case FindingKind::kIdleGpu:
      return "idle_gpu";
    case FindingKind::kScalingEfficiency:
      return "scaling_efficiency";
    case FindingKind::kRegression:
      return "regression";
    case FindingKind::kStall:
      return "stall";
    case FindingKind::kGpuHealth:
      return "gpu_health";
    case FindingKind::kNicHealth:
      return "nic_health";
  }
  return "unknown";
}

const char* SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kCritical:
      return "critical";
  }
  return "unknown";
}

const char* CauseName(Cause cause) {
  switch (cause) {
    case Cause::kUnknown:
      return "unknown";
    case Cause::kMoreWork:
      return "more_work";
    case Cause::kThermalThrottling:
      return "thermal_throttling";
    case Cause::kPowerThrottling:
      return "power_throttling";
    case Cause::kHardwareSlowdown:
      return "hardware_slowdown";
    case Cause::kLowClocks:
      return "low_clocks";
    case Cause::kHostCpu:
      return "host_cpu";
    case Cause::kDataLoading:
      return "data_loading";
    case Cause::kExposedComm:
      return "exposed_communication";
    case Cause::kMemoryBandwidth:
      return "memory_bandwidth";
    case Cause::kNoWork:
      return "no_work";
    case Cause::kImbalance:
      return "imbalance";
    case Cause::kRankExited:
      return "rank_exited";
    case Cause::kHang:
      return "hang";
    case Cause::kXid:
      return "xid";
    case Cause::kEccUncorrected:
      return "ecc_uncorrected";
    case Cause::kRowRemapPending:
      return "row_remap_pending";
    case Cause::kRowRemapFailure:
      return "row_remap_failure";
    case Cause::kNvlinkDown:
      return "nvlink_down";
    case Cause::kNvlinkErrors:
      return "nvlink_errors";
    case Cause::kPcieDowngraded:
      return "pcie_downgraded";
    case Cause::kPcieReplays:
      return "pcie_replays";
    case Cause::kNicDown:
      return "nic_down";
    case Cause::kNicDegraded:
      return "nic_degraded";
    case Cause::kNicErrors:
      return "nic_errors";
  }
  return "unknown";
}

void SetCause(Finding* f, Cause c) {
  f->cause = c;
  f->causes.clear();
  if (c != Cause::kUnknown) f->causes.push_back(c);
}

Finding JobFinding(FindingKind kind, const std::string& job, int64_t since_step,
                   int64_t since_unix_nanos) {
  Finding f;
  f.kind = kind;
  f.job = job;
  f.since_step = since_step;
  f.since_unix_nanos = since_unix_nanos;
  return f;
}

std::vector<int> BoundedRanks(std::vector<int> ranks, int max) {
  std::sort(ranks.begin(), ranks.end());
  if (static_cast<int>(ranks.size()) > max) ranks.resize(std::max(0, max));
  return ranks;
}

std::string Percent(double ratio) { return absl::StrFormat("%.0f%%", ratio * 100); }

std::string Seconds(double s) {
  if (s < 1) return absl::StrFormat("%.0f ms", s * 1000);
  return absl::StrFormat("%.2f s", s);
}

}  // namespace stepwatch::analysis
