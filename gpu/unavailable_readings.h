// Readings a GPU's driver does not give: recorded in GpuSample.unavailable_metrics with why, and
// logged once per GPU, reading and reason (the agent samples every interval; a missing reading
// is said once, not every time).
#pragma once

#include <map>
#include <string>

#include "gpu/nvml_abi.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::gpu {

// The reason exported for an NVML error: not_supported, no_permission, missing_entry_point,
// gpu_lost or error.
const char* UnavailableReason(nvml::Return rc);

// One GPU's unavailable readings.
class UnavailableReadings {
 public:
  // Records that `reading` of GPU `index` is unavailable in `sample`, and logs it unless the
  // same reason was logged last for it. Informational reasons (the driver or GPU lacks it) are
  // logged as info, the others as warnings.
  void Record(unsigned int index, v1::GpuSample* sample, const char* reading,
              const std::string& reason, const std::string& detail);

 private:
  // Reading -> the reason last logged for it.
  std::map<std::string, std::string> logged_;
};

}  // namespace stepwatch::gpu
