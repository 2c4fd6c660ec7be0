// GPU readings for the agent. NVML is loaded at run time with dlopen, so the agent builds without
// NVIDIA headers and runs on machines without GPUs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::gpu {

// Names of the readings whose availability each GpuSample reports (unavailable_metrics keys); the
// last seven are the health readings (gpu/gpu_health.h kGpuHealthReadingNames).
inline constexpr const char* kGpuMetricNames[] = {
    "utilization",    "memory",           "sm_clock",  "sm_clock_max", "power",     "power_limit",
    "temperature",    "throttle_reasons", "pcie",      "nvlink",       "processes", "sm_activity",
    "dram_bandwidth", "tensor_activity",  "pcie_link", "pcie_replays", "ecc",       "remapped_rows",
    "nvlink_state",   "nvlink_errors",    "xid",
};

// NVIDIA's documented minimum time between two GPM samples of one GPU. Sampled more often, the GPM
// readings are refreshed only once this much time has passed (the previous values are repeated).
inline constexpr int64_t kGpmMinIntervalNanos = 100'000'000;

struct GpuSourceOptions {
  // Library to dlopen; the default is what the NVIDIA driver installs.
  std::string nvml_library = "libnvidia-ml.so.1";
};

class GpuSource {
 public:
  virtual ~GpuSource() = default;
  // One sample per GPU. Fields the driver does not expose are left unset.
  virtual absl::StatusOr<std::vector<v1::GpuSample>> Sample(int64_t now_unix_nanos) = 0;
  // Fills nvml_available, nvml_error, driver_version and gpu_count.
  virtual void DescribeNode(v1::NodeInfo* node) const = 0;
  // nvmlSystemGetNVMLVersion, or empty when unknown.
  virtual std::string NvmlVersion() const { return std::string(); }
};

// Loads NVML and initialises it. Never fails: when NVML cannot be loaded the returned source
// reports no GPUs and says why in DescribeNode (the agent logs that once).
std::unique_ptr<GpuSource> OpenNvmlGpuSource(const GpuSourceOptions& options);

}  // namespace stepwatch::gpu
