#include "gpu/nvml_api.h"

#include "gpu/nvml_symbols.h"

namespace stepwatch::gpu {

void ResolveNvmlApi(void* handle, NvmlApi* api) {
  ResolveNvmlSymbol(handle, &api->init, {"nvmlInit_v2", "nvmlInit"});
  ResolveNvmlSymbol(handle, &api->shutdown, {"nvmlShutdown"});
  ResolveNvmlSymbol(handle, &api->error_string, {"nvmlErrorString"});
  ResolveNvmlSymbol(handle, &api->system_get_driver_version, {"nvmlSystemGetDriverVersion"});
  ResolveNvmlSymbol(handle, &api->system_get_nvml_version, {"nvmlSystemGetNVMLVersion"});
  ResolveNvmlSymbol(handle, &api->device_get_count,
                    {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
  ResolveNvmlSymbol(handle, &api->device_get_handle_by_index,
                    {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  ResolveNvmlSymbol(handle, &api->device_get_name, {"nvmlDeviceGetName"});
  ResolveNvmlSymbol(handle, &api->device_get_uuid, {"nvmlDeviceGetUUID"});
  ResolveNvmlSymbol(handle, &api->device_get_utilization_rates, {"nvmlDeviceGetUtilizationRates"});
  ResolveNvmlSymbol(handle, &api->device_get_memory_info, {"nvmlDeviceGetMemoryInfo"});
  ResolveNvmlSymbol(handle, &api->device_get_clock_info, {"nvmlDeviceGetClockInfo"});
  ResolveNvmlSymbol(handle, &api->device_get_max_clock_info, {"nvmlDeviceGetMaxClockInfo"});
  ResolveNvmlSymbol(handle, &api->device_get_power_usage, {"nvmlDeviceGetPowerUsage"});
  ResolveNvmlSymbol(handle, &api->device_get_power_limit,
                    {"nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"});
  // nvmlDeviceGetTemperature is deprecated in NVML 13; the V form replaces it (R550 and later).
  ResolveNvmlSymbol(handle, &api->device_get_temperature_v, {"nvmlDeviceGetTemperatureV"});
  ResolveNvmlSymbol(handle, &api->device_get_temperature, {"nvmlDeviceGetTemperature"});
  // Renamed in CUDA 12 drivers; the old name stays exported for compatibility.
  ResolveNvmlSymbol(
      handle, &api->device_get_throttle_reasons,
      {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"});
  ResolveNvmlSymbol(handle, &api->device_get_pcie_throughput, {"nvmlDeviceGetPcieThroughput"});
  ResolveNvmlSymbol(handle, &api->device_get_field_values, {"nvmlDeviceGetFieldValues"});
  ResolveNvmlSymbol(handle, &api->device_get_compute_processes_v1,
                    {"nvmlDeviceGetComputeRunningProcesses"});
  ResolveNvmlSymbol(handle, &api->device_get_compute_processes_v2,
                    {"nvmlDeviceGetComputeRunningProcesses_v2"});
  ResolveNvmlSymbol(handle, &api->device_get_compute_processes_v3,
                    {"nvmlDeviceGetComputeRunningProcesses_v3"});
  ResolveNvmlSymbol(handle, &api->device_get_mig_mode, {"nvmlDeviceGetMigMode"});
  ResolveNvmlSymbol(handle, &api->gpm_query_device_support, {"nvmlGpmQueryDeviceSupport"});
  ResolveNvmlSymbol(handle, &api->gpm_sample_alloc, {"nvmlGpmSampleAlloc"});
  ResolveNvmlSymbol(handle, &api->gpm_sample_free, {"nvmlGpmSampleFree"});
  ResolveNvmlSymbol(handle, &api->gpm_sample_get, {"nvmlGpmSampleGet"});
  ResolveNvmlSymbol(handle, &api->gpm_metrics_get, {"nvmlGpmMetricsGet"});
}

}  // namespace stepwatch::gpu
