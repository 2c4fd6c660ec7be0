#include "gpu/gpu_source.h"

#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "gpu/nvml_abi.h"

namespace stepwatch::gpu {
namespace {

// Entry points resolved from the loaded library; nullptr when this driver does not export one.
struct NvmlApi {
  nvml::InitFn init = nullptr;
  nvml::ShutdownFn shutdown = nullptr;
  nvml::ErrorStringFn error_string = nullptr;
  nvml::SystemGetDriverVersionFn system_get_driver_version = nullptr;
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
  nvml::DeviceGetTemperatureFn device_get_temperature = nullptr;
  nvml::DeviceGetUllFn device_get_throttle_reasons = nullptr;
  nvml::DeviceGetPcieThroughputFn device_get_pcie_throughput = nullptr;
  nvml::DeviceGetFieldValuesFn device_get_field_values = nullptr;
  nvml::DeviceGetProcessesFn device_get_compute_processes = nullptr;
  nvml::GpmQueryDeviceSupportFn gpm_query_device_support = nullptr;
  nvml::GpmSampleAllocFn gpm_sample_alloc = nullptr;
  nvml::GpmSampleFreeFn gpm_sample_free = nullptr;
  nvml::GpmSampleGetFn gpm_sample_get = nullptr;
  nvml::GpmMetricsGetFn gpm_metrics_get = nullptr;
};

// Resolves the first of `names` that the library exports (newest version first).
template <typename Fn>
void Resolve(void* handle, Fn* out, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (void* sym = dlsym(handle, name)) {
      *out = reinterpret_cast<Fn>(sym);
      return;
    }
  }
  *out = nullptr;
}

constexpr double kKiB = 1024.0;
constexpr unsigned int kMaxGpus = 1024;

// Per-GPU state carried between samples: NVLink counters and GPM samples need two readings.
struct DeviceState {
  bool gpm_probed = false;
  bool gpm_supported = false;
  nvml::GpmSample gpm_prev = nullptr;
  nvml::GpmSample gpm_cur = nullptr;
  bool gpm_has_prev = false;

  bool nvlink_has_prev = false;
  unsigned long long nvlink_tx_kib = 0;
  unsigned long long nvlink_rx_kib = 0;
  int64_t nvlink_time_us = 0;
};

class NvmlGpuSource : public GpuSource {
 public:
  explicit NvmlGpuSource(const GpuSourceOptions& options) : options_(options) { Open(); }

  ~NvmlGpuSource() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (DeviceState& state : devices_) {
      if (api_.gpm_sample_free != nullptr) {
        if (state.gpm_prev != nullptr) api_.gpm_sample_free(state.gpm_prev);
        if (state.gpm_cur != nullptr) api_.gpm_sample_free(state.gpm_cur);
      }
    }
    devices_.clear();
    if (initialized_ && api_.shutdown != nullptr) api_.shutdown();
    if (handle_ != nullptr) dlclose(handle_);
  }

  absl::StatusOr<std::vector<v1::GpuSample>> Sample(int64_t now_unix_nanos) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::GpuSample> samples;
    if (!initialized_) return samples;
    unsigned int count = 0;
    nvml::Return rc = api_.device_get_count(&count);
    if (rc != nvml::kSuccess) {
      return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount: ", ErrorString(rc)));
    }
    // Bounded: per-GPU state must not grow without limit on a confused driver.
    if (count > kMaxGpus) {
      LogLimited(
          absl::StrCat("nvmlDeviceGetCount says ", count, " GPUs; reading the first ", kMaxGpus));
      count = kMaxGpus;
    }
    gpu_count_ = static_cast<int>(count);
    if (devices_.size() < count) devices_.resize(count);
    samples.reserve(count);
    for (unsigned int i = 0; i < count; ++i) {
      nvml::Device device = nullptr;
      rc = api_.device_get_handle_by_index(i, &device);
      if (rc != nvml::kSuccess) {
        LogLimited(absl::StrCat("nvmlDeviceGetHandleByIndex(", i, "): ", ErrorString(rc)));
        continue;
      }
      samples.push_back(SampleDevice(i, device, now_unix_nanos, &devices_[i]));
    }
    return samples;
  }

  void DescribeNode(v1::NodeInfo* node) const override {
    std::lock_guard<std::mutex> lock(mu_);
    node->set_nvml_available(initialized_);
    node->set_nvml_error(error_);
    node->set_driver_version(driver_version_);
    node->set_gpu_count(gpu_count_);
  }

 private:
  void Open() {
    handle_ = dlopen(options_.nvml_library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      error_ = absl::StrCat("cannot load ", options_.nvml_library, ": ",
                            why != nullptr ? why : "unknown dlopen error");
      return;
    }
    Resolve(handle_, &api_.init, {"nvmlInit_v2", "nvmlInit"});
    Resolve(handle_, &api_.shutdown, {"nvmlShutdown"});
    Resolve(handle_, &api_.error_string, {"nvmlErrorString"});
    Resolve(handle_, &api_.system_get_driver_version, {"nvmlSystemGetDriverVersion"});
    Resolve(handle_, &api_.device_get_count, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
    Resolve(handle_, &api_.device_get_handle_by_index,
            {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
    Resolve(handle_, &api_.device_get_name, {"nvmlDeviceGetName"});
    Resolve(handle_, &api_.device_get_uuid, {"nvmlDeviceGetUUID"});
    Resolve(handle_, &api_.device_get_utilization_rates, {"nvmlDeviceGetUtilizationRates"});
    Resolve(handle_, &api_.device_get_memory_info, {"nvmlDeviceGetMemoryInfo"});
    Resolve(handle_, &api_.device_get_clock_info, {"nvmlDeviceGetClockInfo"});
    Resolve(handle_, &api_.device_get_max_clock_info, {"nvmlDeviceGetMaxClockInfo"});
    Resolve(handle_, &api_.device_get_power_usage, {"nvmlDeviceGetPowerUsage"});
    Resolve(handle_, &api_.device_get_power_limit,
            {"nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"});
    Resolve(handle_, &api_.device_get_temperature, {"nvmlDeviceGetTemperature"});
    // Renamed in CUDA 12 drivers; the old name stays exported for compatibility.
    Resolve(
        handle_, &api_.device_get_throttle_reasons,
        {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"});
    Resolve(handle_, &api_.device_get_pcie_throughput, {"nvmlDeviceGetPcieThroughput"});
    Resolve(handle_, &api_.device_get_field_values, {"nvmlDeviceGetFieldValues"});
    // The unversioned entry point uses a shorter struct (v1); only v2/v3 share ProcessInfoV2.
    Resolve(handle_, &api_.device_get_compute_processes,
            {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"});
    Resolve(handle_, &api_.gpm_query_device_support, {"nvmlGpmQueryDeviceSupport"});
    Resolve(handle_, &api_.gpm_sample_alloc, {"nvmlGpmSampleAlloc"});
    Resolve(handle_, &api_.gpm_sample_free, {"nvmlGpmSampleFree"});
    Resolve(handle_, &api_.gpm_sample_get, {"nvmlGpmSampleGet"});
    Resolve(handle_, &api_.gpm_metrics_get, {"nvmlGpmMetricsGet"});

    if (api_.init == nullptr || api_.device_get_count == nullptr ||
        api_.device_get_handle_by_index == nullptr) {
      error_ = absl::StrCat(options_.nvml_library,
                            " lacks nvmlInit/nvmlDeviceGetCount/nvmlDeviceGetHandleByIndex");
      Close();
      return;
    }
    nvml::Return rc = api_.init();
    if (rc != nvml::kSuccess) {
      error_ = absl::StrCat("nvmlInit_v2: ", ErrorString(rc));
      Close();
      return;
    }
    initialized_ = true;
    if (api_.system_get_driver_version != nullptr) {
      char version[nvml::kDriverVersionBufferSize] = {};
      if (api_.system_get_driver_version(version, sizeof(version)) == nvml::kSuccess) {
        driver_version_.assign(version, strnlen(version, sizeof(version)));
      }
    }
    unsigned int count = 0;
    if (api_.device_get_count(&count) == nvml::kSuccess) gpu_count_ = static_cast<int>(count);
  }

  void Close() {
    dlclose(handle_);
    handle_ = nullptr;
    api_ = NvmlApi();
  }

  std::string ErrorString(nvml::Return rc) const {
    const char* text = api_.error_string != nullptr ? api_.error_string(rc) : nullptr;
    if (text == nullptr) return absl::StrCat("NVML error ", rc);
    return absl::StrCat(text, " (", rc, ")");
  }

  // Errors other than "not supported" mean something is wrong with the driver or the GPU; say it
  // at a bounded rate instead of once per sample.
  void LogLimited(const std::string& message) {
    uint64_t suppressed = 0;
    if (log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "NVML: " << message
                     << (suppressed > 0 ? absl::StrCat(" (", suppressed, " similar suppressed)")
                                        : std::string());
    }
  }

  // True when the call succeeded; "not supported" and missing entry points are silent.
  bool Ok(nvml::Return rc, const char* what, unsigned int index) {
    if (rc == nvml::kSuccess) return true;
    if (rc != nvml::kErrorNotSupported && rc != nvml::kErrorFunctionNotFound &&
        rc != nvml::kErrorNoPermission) {
      LogLimited(absl::StrCat(what, " on GPU ", index, ": ", ErrorString(rc)));
    }
    return false;
  }

  v1::GpuSample SampleDevice(unsigned int index, nvml::Device device, int64_t now_unix_nanos,
                             DeviceState* state) {
    v1::GpuSample s;
    s.set_index(static_cast<int32_t>(index));
    s.set_sampled_unix_nanos(now_unix_nanos);
    if (api_.device_get_name != nullptr) {
      char name[nvml::kDeviceNameBufferSize] = {};
      if (Ok(api_.device_get_name(device, name, sizeof(name)), "nvmlDeviceGetName", index)) {
        s.set_name(std::string(name, strnlen(name, sizeof(name))));
      }
    }
    if (api_.device_get_uuid != nullptr) {
      char uuid[nvml::kDeviceUuidBufferSize] = {};
      if (Ok(api_.device_get_uuid(device, uuid, sizeof(uuid)), "nvmlDeviceGetUUID", index)) {
        s.set_uuid(std::string(uuid, strnlen(uuid, sizeof(uuid))));
      }
    }
    if (api_.device_get_utilization_rates != nullptr) {
      nvml::Utilization u{};
      if (Ok(api_.device_get_utilization_rates(device, &u), "nvmlDeviceGetUtilizationRates",
             index)) {
        s.set_utilization_gpu_ratio(u.gpu / 100.0);
        s.set_utilization_memory_ratio(u.memory / 100.0);
      }
    }
    if (api_.device_get_memory_info != nullptr) {
      nvml::Memory m{};
      if (Ok(api_.device_get_memory_info(device, &m), "nvmlDeviceGetMemoryInfo", index)) {
        s.set_memory_used_bytes(m.used);
        s.set_memory_total_bytes(m.total);
      }
    }
    unsigned int value = 0;
    if (api_.device_get_clock_info != nullptr &&
        Ok(api_.device_get_clock_info(device, nvml::kClockSm, &value), "nvmlDeviceGetClockInfo",
           index)) {
      s.set_sm_clock_mhz(value);
    }
    if (api_.device_get_max_clock_info != nullptr &&
        Ok(api_.device_get_max_clock_info(device, nvml::kClockSm, &value),
           "nvmlDeviceGetMaxClockInfo", index)) {
      s.set_sm_clock_max_mhz(value);
    }
    if (api_.device_get_power_usage != nullptr &&
        Ok(api_.device_get_power_usage(device, &value), "nvmlDeviceGetPowerUsage", index)) {
      s.set_power_watts(value / 1000.0);  // NVML reports milliwatts.
    }
    if (api_.device_get_power_limit != nullptr &&
        Ok(api_.device_get_power_limit(device, &value), "nvmlDeviceGetEnforcedPowerLimit", index)) {
      s.set_power_limit_watts(value / 1000.0);
    }
    if (api_.device_get_temperature != nullptr &&
        Ok(api_.device_get_temperature(device, nvml::kTemperatureGpu, &value),
           "nvmlDeviceGetTemperature", index)) {
      s.set_temperature_celsius(value);
    }
    if (api_.device_get_throttle_reasons != nullptr) {
      unsigned long long reasons = 0;
      if (Ok(api_.device_get_throttle_reasons(device, &reasons),
             "nvmlDeviceGetCurrentClocksEventReasons", index)) {
        s.set_throttle_reasons(reasons);
      }
    }
    if (api_.device_get_pcie_throughput != nullptr) {
      if (Ok(api_.device_get_pcie_throughput(device, nvml::kPcieUtilTxBytes, &value),
             "nvmlDeviceGetPcieThroughput", index)) {
        s.set_pcie_tx_bytes_per_second(value * kKiB);
      }
      if (Ok(api_.device_get_pcie_throughput(device, nvml::kPcieUtilRxBytes, &value),
             "nvmlDeviceGetPcieThroughput", index)) {
        s.set_pcie_rx_bytes_per_second(value * kKiB);
      }
    }
    SampleNvlink(index, device, now_unix_nanos, state, &s);
    SampleProcesses(index, device, &s);
    SampleGpm(index, device, state, &s);
    return s;
  }

  // NVLink counters are cumulative KiB for the whole GPU; the rate needs the previous reading.
  void SampleNvlink(unsigned int index, nvml::Device device, int64_t now_unix_nanos,
                    DeviceState* state, v1::GpuSample* s) {
    if (api_.device_get_field_values == nullptr) return;
    nvml::FieldValue values[2] = {};
    values[0].field_id = nvml::kFieldNvlinkThroughputDataTx;
    values[1].field_id = nvml::kFieldNvlinkThroughputDataRx;
    if (!Ok(api_.device_get_field_values(device, 2, values), "nvmlDeviceGetFieldValues", index)) {
      return;
    }
    if (values[0].nvml_return != nvml::kSuccess || values[1].nvml_return != nvml::kSuccess) {
      return;
    }
    const unsigned long long tx = FieldAsUll(values[0]);
    const unsigned long long rx = FieldAsUll(values[1]);
    // Prefer the driver's timestamp of the reading; fall back to the caller's clock.
    int64_t time_us = values[0].timestamp > 0 ? values[0].timestamp : now_unix_nanos / 1000;
    if (state->nvlink_has_prev && time_us > state->nvlink_time_us && tx >= state->nvlink_tx_kib &&
        rx >= state->nvlink_rx_kib) {
      const double seconds = (time_us - state->nvlink_time_us) / 1e6;
      s->set_nvlink_tx_bytes_per_second((tx - state->nvlink_tx_kib) * kKiB / seconds);
      s->set_nvlink_rx_bytes_per_second((rx - state->nvlink_rx_kib) * kKiB / seconds);
    }
    state->nvlink_has_prev = true;
    state->nvlink_tx_kib = tx;
    state->nvlink_rx_kib = rx;
    state->nvlink_time_us = time_us;
  }

  static unsigned long long FieldAsUll(const nvml::FieldValue& v) {
    switch (v.value_type) {
      case nvml::kValueTypeDouble:
        return static_cast<unsigned long long>(v.value.d_val);
      case nvml::kValueTypeUnsignedInt:
        return v.value.ui_val;
      case nvml::kValueTypeUnsignedLong:
        return v.value.ul_val;
      case nvml::kValueTypeSignedLongLong:
        return static_cast<unsigned long long>(v.value.sll_val);
      case nvml::kValueTypeSignedInt:
        return static_cast<unsigned long long>(v.value.si_val);
      default:
        return v.value.ull_val;
    }
  }

  void SampleProcesses(unsigned int index, nvml::Device device, v1::GpuSample* s) {
    if (api_.device_get_compute_processes == nullptr) return;
    // Grow once if the first buffer is too small; processes may start in between, so bound it.
    std::vector<nvml::ProcessInfoV2> infos(64);
    for (int attempt = 0; attempt < 3; ++attempt) {
      unsigned int n = static_cast<unsigned int>(infos.size());
      nvml::Return rc = api_.device_get_compute_processes(device, &n, infos.data());
      if (rc == nvml::kErrorInsufficientSize && n > infos.size()) {
        infos.resize(n + 16);
        continue;
      }
      if (!Ok(rc, "nvmlDeviceGetComputeRunningProcesses", index)) return;
      for (unsigned int i = 0; i < n && i < infos.size(); ++i) s->add_pids(infos[i].pid);
      return;
    }
  }

  // GPM metrics are computed between two samples: this call's and the previous call's.
  void SampleGpm(unsigned int index, nvml::Device device, DeviceState* state, v1::GpuSample* s) {
    if (api_.gpm_sample_alloc == nullptr || api_.gpm_sample_free == nullptr ||
        api_.gpm_sample_get == nullptr || api_.gpm_metrics_get == nullptr) {
      return;
    }
    if (!state->gpm_probed) {
      state->gpm_probed = true;
      if (api_.gpm_query_device_support != nullptr) {
        nvml::GpmSupport support{};
        support.version = nvml::kGpmSupportVersion;
        state->gpm_supported = api_.gpm_query_device_support(device, &support) == nvml::kSuccess &&
                               support.is_supported_device != 0;
      }
      if (state->gpm_supported && (api_.gpm_sample_alloc(&state->gpm_prev) != nvml::kSuccess ||
                                   api_.gpm_sample_alloc(&state->gpm_cur) != nvml::kSuccess)) {
        state->gpm_supported = false;
      }
    }
    if (!state->gpm_supported) return;
    if (!Ok(api_.gpm_sample_get(device, state->gpm_cur), "nvmlGpmSampleGet", index)) {
      state->gpm_has_prev = false;
      return;
    }
    if (state->gpm_has_prev) {
      nvml::GpmMetricsGet get{};
      get.version = nvml::kGpmMetricsGetVersion;
      get.num_metrics = 3;
      get.sample1 = state->gpm_prev;
      get.sample2 = state->gpm_cur;
      get.metrics[0].metric_id = nvml::kGpmMetricSmUtil;
      get.metrics[1].metric_id = nvml::kGpmMetricDramBwUtil;
      get.metrics[2].metric_id = nvml::kGpmMetricAnyTensorUtil;
      if (Ok(api_.gpm_metrics_get(&get), "nvmlGpmMetricsGet", index)) {
        // GPM reports percentages.
        if (get.metrics[0].nvml_return == nvml::kSuccess) {
          s->set_sm_activity_ratio(get.metrics[0].value / 100.0);
        }
        if (get.metrics[1].nvml_return == nvml::kSuccess) {
          s->set_dram_bandwidth_ratio(get.metrics[1].value / 100.0);
        }
        if (get.metrics[2].nvml_return == nvml::kSuccess) {
          s->set_tensor_activity_ratio(get.metrics[2].value / 100.0);
        }
      }
    }
    std::swap(state->gpm_prev, state->gpm_cur);
    state->gpm_has_prev = true;
  }

  const GpuSourceOptions options_;
  mutable std::mutex mu_;
  void* handle_ = nullptr;
  NvmlApi api_;
  bool initialized_ = false;
  std::string error_;
  std::string driver_version_;
  int gpu_count_ = 0;
  std::vector<DeviceState> devices_;
  LogRateLimiter log_limiter_{5, std::chrono::minutes(1)};
};

}  // namespace

std::unique_ptr<GpuSource> OpenNvmlGpuSource(const GpuSourceOptions& options) {
  return std::make_unique<NvmlGpuSource>(options);
}

}  // namespace stepwatch::gpu
