#include "gpu/unavailable_readings.h"

#include "common/log.h"

namespace stepwatch::gpu {

const char* UnavailableReason(nvml::Return rc) {
  switch (rc) {
    case nvml::kErrorNotSupported:
      return "not_supported";
    case nvml::kErrorNoPermission:
      return "no_permission";
    case nvml::kErrorFunctionNotFound:
      return "missing_entry_point";
    case nvml::kErrorGpuIsLost:
      return "gpu_lost";
    default:
      return "error";
  }
}

void UnavailableReadings::Record(unsigned int index, v1::GpuSample* sample, const char* reading,
                                 const std::string& reason, const std::string& detail) {
  (*sample->mutable_unavailable_metrics())[reading] = reason;
  std::string& last = logged_[reading];
  if (last == reason) return;
  last = reason;
  if (reason == "not_supported" || reason == "missing_entry_point" || reason == "mig_enabled") {
    SW_LOG_INFO << "NVML: GPU " << index << ": " << reading << " unavailable (" << reason
                << "): " << detail;
  } else {
    SW_LOG_WARNING << "NVML: GPU " << index << ": " << reading << " unavailable (" << reason
                   << "): " << detail;
  }
}

}  // namespace stepwatch::gpu
