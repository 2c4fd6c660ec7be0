// The NVML entry points stepwatch calls, resolved from the library loaded with dlopen: each is
// nullptr when the driver does not export it, so that every reading can say it is missing.
#pragma once

#include "gpu/nvml_abi.h"

namespace stepwatch::gpu {

// Entry points resolved from the loaded library; nullptr when this driver does not export one.
struct NvmlApi {
  nvml::InitFn init = nullptr;
  nvml::ShutdownFn shutdown = nullptr;
  nvml::ErrorStringFn error_string = nullptr;
  nvml::SystemGetStringFn system_get_driver_version = nullptr;
  nvml::SystemGetStringFn system_get_nvml_version = nullptr;
  nvml::DeviceGetCountFn device_get_count = nullptr;
  nvml::DeviceGetHandleByIndexFn device_get_handle_by_index = nullptr;
  nvml::DeviceGetStringFn device_get_name = nullptr;
  nvml::DeviceGetStringFn device_get_uuid = nullptr;
  nvml::DeviceGetUtilizationRatesFn device_get_utilization_rates = nullptr;
  nvml::DeviceGetMemoryInfoFn device_get_memory_info = nullptr;
  nvml::DeviceGetClockFn device_get_clock_info = nullptr;
  nvml::DeviceGetClockFn device_get_max_clock_info = nullptr;
  nvml::DeviceGetUintFn device_get_power_usage = nullptr;
  nvml::DeviceGetUintFn device_get_power_limit = nullptr;
  nvml::DeviceGetTemperatureVFn device_get_temperature_v = nullptr;
  nvml::DeviceGetTemperatureFn device_get_temperature = nullptr;
  nvml::DeviceGetUllFn device_get_throttle_reasons = nullptr;
  nvml::DeviceGetPcieThroughputFn device_get_pcie_throughput = nullptr;
  nvml::DeviceGetFieldValuesFn device_get_field_values = nullptr;
  nvml::DeviceGetProcessesFn device_get_compute_processes_v1 = nullptr;
  nvml::DeviceGetProcessesFn device_get_compute_processes_v2 = nullptr;
  nvml::DeviceGetProcessesFn device_get_compute_processes_v3 = nullptr;
  nvml::DeviceGetMigModeFn device_get_mig_mode = nullptr;
  nvml::GpmQueryDeviceSupportFn gpm_query_device_support = nullptr;
  nvml::GpmSampleAllocFn gpm_sample_alloc = nullptr;
  nvml::GpmSampleFreeFn gpm_sample_free = nullptr;
  nvml::GpmSampleGetFn gpm_sample_get = nullptr;
  nvml::GpmMetricsGetFn gpm_metrics_get = nullptr;
};

// Resolves every entry point of `api` from `handle` (the newest version of each first).
void ResolveNvmlApi(void* handle, NvmlApi* api);

}  // namespace stepwatch::gpu
