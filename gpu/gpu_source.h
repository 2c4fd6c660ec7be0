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
};

// Loads NVML and initialises it. Never fails: when NVML cannot be loaded the returned source
// reports no GPUs and says why in DescribeNode (the agent logs that once).
std::unique_ptr<GpuSource> OpenNvmlGpuSource(const GpuSourceOptions& options);

}  // namespace stepwatch::gpu
