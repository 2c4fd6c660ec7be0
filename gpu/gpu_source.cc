#include "gpu/gpu_source.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "gpu/gpm_sampler.h"
#include "gpu/gpu_health.h"
#include "gpu/nvml_abi.h"
#include "gpu/nvml_api.h"
#include "gpu/nvml_decode.h"
#include "gpu/unavailable_readings.h"

namespace stepwatch::gpu {
namespace {

// A process-list entry point and the entry size it writes on this driver.
struct ProcessEntryPoint {
  nvml::DeviceGetProcessesFn fn;
  const char* name;
  size_t entry_size;
};

// Why a reading is missing, as exported in GpuSample.unavailable_metrics.
const char* ReasonOf(nvml::Return rc) { return UnavailableReason(rc); }

constexpr double kKiB = 1024.0;
constexpr unsigned int kMaxGpus = 1024;
// Process buffers start at this many entries and grow to what the driver asks for, up to the cap.
constexpr unsigned int kInitialProcessEntries = 64;
constexpr unsigned int kMaxProcessEntries = 65536;
// Per-GPU state carried between samples: NVLink rates need two readings.
struct DeviceState {
  bool nvlink_has_prev = false;
  unsigned long long nvlink_tx_kib = 0;
  unsigned long long nvlink_rx_kib = 0;
  int64_t nvlink_time_us = 0;

  UnavailableReadings unavailable;
};

class NvmlGpuSource : public GpuSource {
 public:
  explicit NvmlGpuSource(const GpuSourceOptions& options) : options_(options) {
    absl::MutexLock lock(&mu_);
    Open();
  }

  ~NvmlGpuSource() override {
    absl::MutexLock lock(&mu_);
    gpm_.reset();     // Frees its GPM samples, before nvmlShutdown.
    health_.reset();  // Frees its NVML event set, before nvmlShutdown.
    if (initialized_ && api_.shutdown != nullptr) api_.shutdown();
    if (handle_ != nullptr) dlclose(handle_);
  }

  absl::StatusOr<std::vector<v1::GpuSample>> Sample(int64_t now_unix_nanos) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
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

  void DescribeNode(v1::NodeInfo* node) const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    node->set_nvml_available(initialized_);
    node->set_nvml_error(error_);
    node->set_driver_version(driver_version_);
    node->set_gpu_count(gpu_count_);
  }

  std::string NvmlVersion() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return nvml_version_;
  }

 private:
  void Open() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    handle_ = dlopen(options_.nvml_library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      error_ = absl::StrCat("cannot load ", options_.nvml_library, ": ",
                            why != nullptr ? why : "unknown dlopen error");
      return;
    }
    ResolveNvmlApi(handle_, &api_);

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
    health_ = std::make_unique<GpuHealthReader>(handle_, api_.error_string);
    gpm_ = std::make_unique<GpmSampler>(&api_);
    driver_version_ = SystemString(api_.system_get_driver_version);
    nvml_version_ = SystemString(api_.system_get_nvml_version);
    // _v2 first: it writes 24-byte entries on every driver that has it. _v3's entry size depends
    // on the driver (32 bytes on 535.43..535.86); the unversioned call writes 16-byte entries.
    if (api_.device_get_compute_processes_v2 != nullptr) {
      process_entry_points_.push_back({api_.device_get_compute_processes_v2,
                                       "nvmlDeviceGetComputeRunningProcesses_v2",
                                       sizeof(nvml::ProcessInfoV2)});
    }
    if (api_.device_get_compute_processes_v3 != nullptr) {
      process_entry_points_.push_back({api_.device_get_compute_processes_v3,
                                       "nvmlDeviceGetComputeRunningProcesses_v3",
                                       ProcessEntrySizeOfV3(driver_version_)});
    }
    if (api_.device_get_compute_processes_v1 != nullptr) {
      process_entry_points_.push_back({api_.device_get_compute_processes_v1,
                                       "nvmlDeviceGetComputeRunningProcesses",
                                       sizeof(nvml::ProcessInfoV1)});
    }
    unsigned int count = 0;
    if (api_.device_get_count(&count) == nvml::kSuccess) gpu_count_ = static_cast<int>(count);
  }

  std::string SystemString(nvml::SystemGetStringFn fn) const {
    if (fn == nullptr) return std::string();
    char text[nvml::kNvmlVersionBufferSize] = {};
    if (fn(text, sizeof(text)) != nvml::kSuccess) return std::string();
    return std::string(text, strnlen(text, sizeof(text)));
  }

  void Close() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    dlclose(handle_);
    handle_ = nullptr;
    api_ = NvmlApi();
  }

  std::string ErrorString(nvml::Return rc) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const char* text = api_.error_string != nullptr ? api_.error_string(rc) : nullptr;
    if (text == nullptr) return absl::StrCat("NVML error ", rc);
    return absl::StrCat(text, " (", rc, ")");
  }

  // Errors not tied to one reading; said at a bounded rate instead of once per sample.
  void LogLimited(const std::string& message) {
    uint64_t suppressed = 0;
    if (log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "NVML: " << message
                     << (suppressed > 0 ? absl::StrCat(" (", suppressed, " similar suppressed)")
                                        : std::string());
    }
  }

  // Records that `metric` is unavailable on this GPU and why; logs once per GPU, metric and reason.
  static void Unavailable(unsigned int index, DeviceState* state, v1::GpuSample* s,
                          const char* metric, const std::string& reason,
                          const std::string& detail) {
    state->unavailable.Record(index, s, metric, reason, detail);
  }

  // True when the call succeeded; otherwise records why `metric` is unavailable.
  bool Check(nvml::Return rc, const char* what, unsigned int index, DeviceState* state,
             v1::GpuSample* s, const char* metric) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (rc == nvml::kSuccess) return true;
    Unavailable(index, state, s, metric, ReasonOf(rc), absl::StrCat(what, ": ", ErrorString(rc)));
    return false;
  }

  // False (and `metric` recorded as missing) when this driver does not export `fn`.
  template <typename Fn>
  static bool Exported(Fn fn, const char* what, unsigned int index, DeviceState* state,
                       v1::GpuSample* s, const char* metric) {
    if (fn != nullptr) return true;
    Unavailable(index, state, s, metric, "missing_entry_point",
                absl::StrCat("the library does not export ", what));
    return false;
  }

  v1::GpuSample SampleDevice(unsigned int index, nvml::Device device, int64_t now_unix_nanos,
                             DeviceState* state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::GpuSample s;
    s.set_index(static_cast<int32_t>(index));
    s.set_sampled_unix_nanos(now_unix_nanos);
    const bool mig = SampleIdentity(device, &s);
    SampleUtilization(index, device, mig, state, &s);
    SampleMemory(index, device, state, &s);
    SampleClocksAndPower(index, device, state, &s);
    SampleTemperature(index, device, state, &s);
    SampleThrottleAndPcie(index, device, state, &s);
    SampleNvlink(index, device, now_unix_nanos, state, &s);
    SampleProcesses(index, device, state, &s);
    gpm_->Sample(index, device, mig, &state->unavailable, &s);
    health_->Read(index, device, now_unix_nanos, &state->unavailable, &s);
    return s;
  }

  // Name and UUID; returns whether MIG is enabled.
  bool SampleIdentity(nvml::Device device, v1::GpuSample* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (api_.device_get_name != nullptr) {
      char name[nvml::kDeviceNameBufferSize] = {};
      if (api_.device_get_name(device, name, sizeof(name)) == nvml::kSuccess) {
        s->set_name(std::string(name, strnlen(name, sizeof(name))));
      }
    }
    if (api_.device_get_uuid != nullptr) {
      char uuid[nvml::kDeviceUuidBufferSize] = {};
      if (api_.device_get_uuid(device, uuid, sizeof(uuid)) == nvml::kSuccess) {
        s->set_uuid(std::string(uuid, strnlen(uuid, sizeof(uuid))));
      }
    }
    // With MIG enabled the parent GPU has no device-wide utilization or GPM readings; per-instance
    // readings are not collected (agent/README.md, "MIG").
    bool mig = false;
    if (api_.device_get_mig_mode != nullptr) {
      unsigned int current = nvml::kDeviceMigDisable;
      unsigned int pending = nvml::kDeviceMigDisable;
      mig = api_.device_get_mig_mode(device, &current, &pending) == nvml::kSuccess &&
            current == nvml::kDeviceMigEnable;
    }
    return mig;
  }

  void SampleUtilization(unsigned int index, nvml::Device device, bool mig, DeviceState* state,
                         v1::GpuSample* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (mig) {
      Unavailable(index, state, s, "utilization", "mig_enabled",
                  "MIG mode is enabled; per-instance utilization is not collected");
    } else if (Exported(api_.device_get_utilization_rates, "nvmlDeviceGetUtilizationRates", index,
                        state, s, "utilization")) {
      nvml::Utilization u{};
      if (Check(api_.device_get_utilization_rates(device, &u), "nvmlDeviceGetUtilizationRates",
                index, state, s, "utilization")) {
        s->set_utilization_gpu_ratio(u.gpu / 100.0);
        s->set_utilization_memory_ratio(u.memory / 100.0);
      }
    }
  }

  void SampleMemory(unsigned int index, nvml::Device device, DeviceState* state, v1::GpuSample* s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (Exported(api_.device_get_memory_info, "nvmlDeviceGetMemoryInfo", index, state, s,
                 "memory")) {
      nvml::Memory m{};
      if (Check(api_.device_get_memory_info(device, &m), "nvmlDeviceGetMemoryInfo", index, state, s,
                "memory")) {
        s->set_memory_used_bytes(m.used);
        s->set_memory_total_bytes(m.total);
      }
    }
  }

  void SampleClocksAndPower(unsigned int index, nvml::Device device, DeviceState* state,
                            v1::GpuSample* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    unsigned int value = 0;
    if (Exported(api_.device_get_clock_info, "nvmlDeviceGetClockInfo", index, state, s,
                 "sm_clock") &&
        Check(api_.device_get_clock_info(device, nvml::kClockSm, &value), "nvmlDeviceGetClockInfo",
              index, state, s, "sm_clock")) {
      s->set_sm_clock_mhz(value);
    }
    if (Exported(api_.device_get_max_clock_info, "nvmlDeviceGetMaxClockInfo", index, state, s,
                 "sm_clock_max") &&
        Check(api_.device_get_max_clock_info(device, nvml::kClockSm, &value),
              "nvmlDeviceGetMaxClockInfo", index, state, s, "sm_clock_max")) {
      s->set_sm_clock_max_mhz(value);
    }
    if (Exported(api_.device_get_power_usage, "nvmlDeviceGetPowerUsage", index, state, s,
                 "power") &&
        Check(api_.device_get_power_usage(device, &value), "nvmlDeviceGetPowerUsage", index, state,
              s, "power")) {
      s->set_power_watts(value / 1000.0);  // NVML reports milliwatts.
    }
    if (Exported(api_.device_get_power_limit, "nvmlDeviceGetEnforcedPowerLimit", index, state, s,
                 "power_limit") &&
        Check(api_.device_get_power_limit(device, &value), "nvmlDeviceGetEnforcedPowerLimit", index,
              state, s, "power_limit")) {
      s->set_power_limit_watts(value / 1000.0);
    }
  }

  void SampleThrottleAndPcie(unsigned int index, nvml::Device device, DeviceState* state,
                             v1::GpuSample* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (Exported(api_.device_get_throttle_reasons, "nvmlDeviceGetCurrentClocksEventReasons", index,
                 state, s, "throttle_reasons")) {
      unsigned long long reasons = 0;
      if (Check(api_.device_get_throttle_reasons(device, &reasons),
                "nvmlDeviceGetCurrentClocksEventReasons", index, state, s, "throttle_reasons")) {
        s->set_throttle_reasons(reasons);
      }
    }
    if (Exported(api_.device_get_pcie_throughput, "nvmlDeviceGetPcieThroughput", index, state, s,
                 "pcie")) {
      unsigned int tx = 0;
      unsigned int rx = 0;
      if (Check(api_.device_get_pcie_throughput(device, nvml::kPcieUtilTxBytes, &tx),
                "nvmlDeviceGetPcieThroughput(TX)", index, state, s, "pcie") &&
          Check(api_.device_get_pcie_throughput(device, nvml::kPcieUtilRxBytes, &rx),
                "nvmlDeviceGetPcieThroughput(RX)", index, state, s, "pcie")) {
        s->set_pcie_tx_bytes_per_second(tx * kKiB);
        s->set_pcie_rx_bytes_per_second(rx * kKiB);
      }
    }
  }

  // nvmlDeviceGetTemperatureV first (NVML 13 deprecates the older call), then the older call.
  void SampleTemperature(unsigned int index, nvml::Device device, DeviceState* state,
                         v1::GpuSample* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    nvml::Return rc = nvml::kErrorFunctionNotFound;
    std::string detail = "the library exports neither nvmlDeviceGetTemperatureV nor ...Temperature";
    if (api_.device_get_temperature_v != nullptr) {
      nvml::Temperature t{};
      t.version = nvml::kTemperatureVersion1;
      t.sensor_type = static_cast<int>(nvml::kTemperatureGpu);
      rc = api_.device_get_temperature_v(device, &t);
      if (rc == nvml::kSuccess) {
        s->set_temperature_celsius(t.temperature);
        return;
      }
      detail = absl::StrCat("nvmlDeviceGetTemperatureV: ", ErrorString(rc));
    }
    if (api_.device_get_temperature != nullptr) {
      unsigned int celsius = 0;
      rc = api_.device_get_temperature(device, nvml::kTemperatureGpu, &celsius);
      if (rc == nvml::kSuccess) {
        s->set_temperature_celsius(celsius);
        return;
      }
      absl::StrAppend(&detail, "; nvmlDeviceGetTemperature: ", ErrorString(rc));
    }
    Unavailable(index, state, s, "temperature", ReasonOf(rc), detail);
  }

  // NVLink counters are cumulative KiB; scopeId UINT_MAX sums them over all links.
  void SampleNvlink(unsigned int index, nvml::Device device, int64_t now_unix_nanos,
                    DeviceState* state, v1::GpuSample* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!Exported(api_.device_get_field_values, "nvmlDeviceGetFieldValues", index, state, s,
                  "nvlink")) {
      return;
    }
    nvml::FieldValue values[2] = {};
    values[0].field_id = nvml::kFieldNvlinkThroughputDataTx;
    values[0].scope_id = nvml::kScopeAllLinks;
    values[1].field_id = nvml::kFieldNvlinkThroughputDataRx;
    values[1].scope_id = nvml::kScopeAllLinks;
    if (!Check(api_.device_get_field_values(device, 2, values), "nvmlDeviceGetFieldValues", index,
               state, s, "nvlink") ||
        !Check(values[0].nvml_return, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", index, state, s,
               "nvlink") ||
        !Check(values[1].nvml_return, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", index, state, s,
               "nvlink")) {
      state->nvlink_has_prev = false;
      return;
    }
    const std::optional<unsigned long long> tx = FieldValueAsCounter(values[0]);
    const std::optional<unsigned long long> rx = FieldValueAsCounter(values[1]);
    if (!tx || !rx) {
      Unavailable(index, state, s, "nvlink", "error",
                  absl::StrCat("unexpected NVLink value types ", values[0].value_type, " and ",
                               values[1].value_type));
      state->nvlink_has_prev = false;
      return;
    }
    // Prefer the driver's timestamp of the reading; fall back to the caller's clock.
    int64_t time_us = values[0].timestamp > 0 ? values[0].timestamp : now_unix_nanos / 1000;
    if (state->nvlink_has_prev && time_us > state->nvlink_time_us && *tx >= state->nvlink_tx_kib &&
        *rx >= state->nvlink_rx_kib) {
      const double seconds = (time_us - state->nvlink_time_us) / 1e6;
      s->set_nvlink_tx_bytes_per_second((*tx - state->nvlink_tx_kib) * kKiB / seconds);
      s->set_nvlink_rx_bytes_per_second((*rx - state->nvlink_rx_kib) * kKiB / seconds);
    }
    state->nvlink_has_prev = true;
    state->nvlink_tx_kib = *tx;
    state->nvlink_rx_kib = *rx;
    state->nvlink_time_us = time_us;
  }

  // The buffer always has room for the largest entry any driver writes, so a driver whose entries
  // are larger than expected cannot write past it; the stride used to read it is the entry size
  // this entry point writes on this driver.
  void SampleProcesses(unsigned int index, nvml::Device device, DeviceState* state,
                       v1::GpuSample* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (next_process_entry_point_ < process_entry_points_.size()) {
      const ProcessEntryPoint& ep = process_entry_points_[next_process_entry_point_];
      unsigned int capacity = kInitialProcessEntries;
      std::vector<unsigned char> buffer;
      unsigned int n = 0;
      nvml::Return rc = nvml::kSuccess;
      // Processes may start between calls: grow a bounded number of times.
      for (int attempt = 0; attempt < 4; ++attempt) {
        buffer.assign(static_cast<size_t>(capacity) * kMaxProcessEntrySize, 0);
        n = capacity;
        rc = ep.fn(device, &n, buffer.data());
        if (rc != nvml::kErrorInsufficientSize || n <= capacity || capacity >= kMaxProcessEntries) {
          break;
        }
        capacity = std::min(n + 16, kMaxProcessEntries);
      }
      if (rc == nvml::kErrorFunctionNotFound) {
        // Exported but not implemented by this driver (535.98 has no working _v3): next one.
        LogLimited(absl::StrCat(ep.name, " is not implemented by this driver; trying the next"));
        ++next_process_entry_point_;
        continue;
      }
      if (!Check(rc, ep.name, index, state, s, "processes")) return;
      for (unsigned int pid : PidsFromProcessBuffer(buffer, ep.entry_size, std::min(n, capacity))) {
        s->add_pids(pid);
      }
      return;
    }
    Unavailable(index, state, s, "processes", "missing_entry_point",
                "no nvmlDeviceGetComputeRunningProcesses{,_v2,_v3} works on this driver");
  }

  const GpuSourceOptions options_;
  // NVML is not promised to be thread-safe: every call into it, and all state below, is under mu_.
  mutable absl::Mutex mu_;
  void* handle_ ABSL_GUARDED_BY(mu_) = nullptr;
  NvmlApi api_ ABSL_GUARDED_BY(mu_);
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::string driver_version_ ABSL_GUARDED_BY(mu_);
  std::string nvml_version_ ABSL_GUARDED_BY(mu_);
  int gpu_count_ ABSL_GUARDED_BY(mu_) = 0;
  // In preference order; entries before next_process_entry_point_ proved not implemented.
  std::vector<ProcessEntryPoint> process_entry_points_ ABSL_GUARDED_BY(mu_);
  size_t next_process_entry_point_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<DeviceState> devices_ ABSL_GUARDED_BY(mu_);
  // Set once NVML is initialised.
  std::unique_ptr<GpuHealthReader> health_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<GpmSampler> gpm_ ABSL_GUARDED_BY(mu_);
  LogRateLimiter log_limiter_{5, std::chrono::minutes(1)};
};

}  // namespace

std::unique_ptr<GpuSource> OpenNvmlGpuSource(const GpuSourceOptions& options) {
  return std::make_unique<NvmlGpuSource>(options);
}

}  // namespace stepwatch::gpu
