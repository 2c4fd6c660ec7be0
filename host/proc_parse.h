// Parsers for the kernel files the host sampler reads. Pure functions over file contents, so they
// are tested on captured real output; reading lives in host_sampler.cc and memory_bandwidth.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stepwatch::host {

// Aggregate CPU time from /proc/stat, in clock ticks since boot.
struct CpuTimes {
  uint64_t busy = 0;       // total - idle - iowait
  uint64_t total = 0;      // user + nice + system + idle + iowait + irq + softirq + steal
  uint32_t cpu_count = 0;  // number of "cpuN" lines (online CPUs)
};
absl::StatusOr<CpuTimes> ParseProcStat(absl::string_view text);

// Busy fraction between two readings; nullopt when no time passed or the counters went back.
std::optional<double> CpuUtilization(const CpuTimes& before, const CpuTimes& after);

struct MemInfo {
  uint64_t total_bytes = 0;
  std::optional<uint64_t> available_bytes;  // MemAvailable is absent on kernels before 3.14.
};
absl::StatusOr<MemInfo> ParseMeminfo(absl::string_view text);

// Byte counters from /proc/net/dev summed over every interface except loopback.
struct NetTotals {
  uint64_t receive_bytes = 0;
  uint64_t transmit_bytes = 0;
};
absl::StatusOr<NetTotals> ParseNetDev(absl::string_view text);

// One resctrl mbm_total_bytes file; an error for "Unavailable" (the counter is not ready).
absl::StatusOr<uint64_t> ParseResctrlCounter(absl::string_view text);

// perf PMU sysfs formats: a format file ("config:0-7", "config:0-7,32-35") says where a term's
// bits go; an event file ("event=0x04,umask=0x03") gives the terms. Only "config" is supported.
struct PerfFormatField {
  std::vector<std::pair<int, int>> bit_ranges;  // inclusive [low, high], low bits first
};
absl::StatusOr<PerfFormatField> ParsePerfFormat(absl::string_view text);
// `formats` maps term names to their format files' contents.
absl::StatusOr<uint64_t> ParsePerfEventConfig(
    absl::string_view event, const std::vector<std::pair<std::string, std::string>>& formats);
// Bytes per unit of an event's ".unit" file ("MiB" -> 1048576); error for units that are not bytes.
absl::StatusOr<double> ParsePerfUnitBytes(absl::string_view unit);
// First CPU of a PMU's cpumask ("0", "0,18", "0-3").
absl::StatusOr<int> ParseFirstCpu(absl::string_view cpumask);

}  // namespace stepwatch::host
