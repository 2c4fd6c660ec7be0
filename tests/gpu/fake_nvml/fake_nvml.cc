// A fake NVML for tests and the demo: the NVML entry points stepwatch uses, answering from a JSON
// state file named by STEPWATCH_FAKE_NVML_STATE (format: docs/fake-nvml.md). The file is re-read
// while running when its mtime, size or inode change (checked at most every 100 ms), so a test can
// change utilization on the fly by replacing it (write a temporary file, then rename). A missing or
// half-written file keeps the last good state.
//
// Built twice: as the full fake, and with FAKE_NVML_MINIMAL as a driver that exports only the core
// entry points (to test that missing symbols leave metrics unset).
//
// A C library has process-wide state by nature (nvmlInit is global), so the state lives in one
// function-local object guarded by a mutex.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gpu/nvml_abi.h"

namespace stepwatch::gpu::nvml {
// Handles given out to callers: an index into the state's GPU list.
struct DeviceOpaque {
  unsigned int index;
};
struct GpmSampleOpaque {
  unsigned int device_index;
  bool taken;
};
}  // namespace stepwatch::gpu::nvml

namespace {

namespace nvml = stepwatch::gpu::nvml;
namespace json = stepwatch::json;

constexpr unsigned int kMaxGpus = 64;
constexpr auto kRecheckPeriod = std::chrono::milliseconds(100);
constexpr unsigned int kErrorInvalidArgumentRc = nvml::kErrorInvalidArgument;

struct FakeGpu {
  std::string name;
  std::string uuid;
  std::optional<double> utilization_gpu, utilization_memory;
  std::optional<double> memory_used_bytes, memory_total_bytes;
  std::optional<double> sm_clock_mhz, sm_clock_max_mhz;
  std::optional<double> power_mw, power_limit_mw, temperature_c;
  std::optional<double> throttle_reasons;
  std::optional<double> pcie_tx_kbps, pcie_rx_kbps;
  std::optional<double> nvlink_tx_kbps, nvlink_rx_kbps;
  std::optional<double> sm_activity, dram_bandwidth, tensor_activity;
  std::optional<std::vector<unsigned int>> pids;
};

struct FakeState {
  std::string driver_version = "fake";
  bool fail_init = false;
  std::vector<FakeGpu> gpus;
};

// NVLink counters keep running across state reloads, as the driver's would.
struct NvlinkCounter {
  double tx_kib = 0;
  double rx_kib = 0;
  std::chrono::steady_clock::time_point last{};
};

absl::Status ReadNumber(const json::Value& obj, const char* key, std::optional<double>* out) {
  const json::Value* v = obj.Find(key);
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (!v->is_number()) return absl::InvalidArgumentError(absl::StrCat(key, " must be a number"));
  *out = v->as_double();
  return absl::OkStatus();
}

absl::StatusOr<FakeState> ParseState(const std::string& text) {
  absl::StatusOr<json::Value> parsed = json::Parse(text);
  if (!parsed.ok()) return parsed.status();
  const json::Value& root = *parsed;
  if (!root.is_object()) return absl::InvalidArgumentError("state must be a JSON object");
  FakeState state;
  if (const json::Value* v = root.Find("driver_version"); v != nullptr && v->is_string()) {
    state.driver_version = v->as_string();
  }
  if (const json::Value* v = root.Find("fail_init"); v != nullptr && v->is_bool()) {
    state.fail_init = v->as_bool();
  }
  const json::Value* gpus = root.Find("gpus");
  if (gpus == nullptr) return state;
  if (!gpus->is_array()) return absl::InvalidArgumentError("gpus must be an array");
  if (gpus->as_array().size() > kMaxGpus) return absl::InvalidArgumentError("too many gpus");
  for (const json::Value& g : gpus->as_array()) {
    if (!g.is_object()) return absl::InvalidArgumentError("each gpu must be an object");
    FakeGpu gpu;
    unsigned int index = static_cast<unsigned int>(state.gpus.size());
    gpu.name = "Fake GPU";
    gpu.uuid = absl::StrCat("GPU-fake-", index);
    if (const json::Value* v = g.Find("name"); v != nullptr && v->is_string()) {
      gpu.name = v->as_string();
    }
    if (const json::Value* v = g.Find("uuid"); v != nullptr && v->is_string()) {
      gpu.uuid = v->as_string();
    }
    struct Field {
      const char* key;
      std::optional<double>* out;
    };
    const Field fields[] = {
        {"utilization_gpu", &gpu.utilization_gpu},
        {"utilization_memory", &gpu.utilization_memory},
        {"memory_used_bytes", &gpu.memory_used_bytes},
        {"memory_total_bytes", &gpu.memory_total_bytes},
        {"sm_clock_mhz", &gpu.sm_clock_mhz},
        {"sm_clock_max_mhz", &gpu.sm_clock_max_mhz},
        {"power_mw", &gpu.power_mw},
        {"power_limit_mw", &gpu.power_limit_mw},
        {"temperature_c", &gpu.temperature_c},
        {"throttle_reasons", &gpu.throttle_reasons},
        {"pcie_tx_kbps", &gpu.pcie_tx_kbps},
        {"pcie_rx_kbps", &gpu.pcie_rx_kbps},
        {"nvlink_tx_kbps", &gpu.nvlink_tx_kbps},
        {"nvlink_rx_kbps", &gpu.nvlink_rx_kbps},
        {"sm_activity", &gpu.sm_activity},
        {"dram_bandwidth", &gpu.dram_bandwidth},
        {"tensor_activity", &gpu.tensor_activity},
    };
    for (const Field& f : fields) {
      absl::Status s = ReadNumber(g, f.key, f.out);
      if (!s.ok()) return s;
    }
    if (const json::Value* v = g.Find("pids"); v != nullptr && !v->is_null()) {
      if (!v->is_array()) return absl::InvalidArgumentError("pids must be an array");
      std::vector<unsigned int> pids;
      for (const json::Value& p : v->as_array()) {
        if (!p.is_number() || !p.is_integer() || p.as_int64() < 0) {
          return absl::InvalidArgumentError("pids must be non-negative integers");
        }
        pids.push_back(static_cast<unsigned int>(p.as_int64()));
      }
      gpu.pids = std::move(pids);
    }
    state.gpus.push_back(std::move(gpu));
  }
  return state;
}

class Fake {
 public:
  static Fake& Get() {
    // Destroyed when the library is unloaded (dlclose) or at exit.
    static Fake fake;
    return fake;
  }

  nvml::Return Init() {
    std::lock_guard<std::mutex> lock(mu_);
    const char* path = getenv("STEPWATCH_FAKE_NVML_STATE");
    if (path == nullptr || *path == '\0') return nvml::kErrorDriverNotLoaded;
    path_ = path;
    ReloadLocked(/*force=*/true);
    if (state_.fail_init) return nvml::kErrorDriverNotLoaded;
    ++init_count_;
    return nvml::kSuccess;
  }

  nvml::Return Shutdown() {
    std::lock_guard<std::mutex> lock(mu_);
    if (init_count_ == 0) return nvml::kErrorUninitialized;
    --init_count_;
    return nvml::kSuccess;
  }

  int init_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return init_count_;
  }

  // Runs `fn(state)` on a fresh view of the state; UNINITIALIZED before nvmlInit.
  template <typename Fn>
  nvml::Return With(Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (init_count_ == 0) return nvml::kErrorUninitialized;
    ReloadLocked(/*force=*/false);
    return fn(state_);
  }

  // Same, for one GPU; INVALID_ARGUMENT for a handle that is not (or no longer) a GPU.
  template <typename Fn>
  nvml::Return WithGpu(nvml::Device device, Fn fn) {
    return With([&](const FakeState& state) -> nvml::Return {
      if (device == nullptr || device->index >= state.gpus.size()) return kErrorInvalidArgumentRc;
      return fn(state.gpus[device->index], device->index);
    });
  }

  nvml::Device Handle(unsigned int index) { return &devices_[index]; }

  // Cumulative NVLink KiB, integrated from the configured rates since the previous query.
  void AdvanceNvlink(unsigned int index, const FakeGpu& gpu, double* tx, double* rx) {
    NvlinkCounter& c = nvlink_[index];
    auto now = std::chrono::steady_clock::now();
    if (c.last != std::chrono::steady_clock::time_point{}) {
      double dt = std::chrono::duration<double>(now - c.last).count();
      c.tx_kib += gpu.nvlink_tx_kbps.value_or(0) * dt;
      c.rx_kib += gpu.nvlink_rx_kbps.value_or(0) * dt;
    }
    c.last = now;
    *tx = c.tx_kib;
    *rx = c.rx_kib;
  }

 private:
  Fake() {
    for (unsigned int i = 0; i < kMaxGpus; ++i) devices_[i].index = i;
  }

  void ReloadLocked(bool force) {
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last_check_ < kRecheckPeriod) return;
    last_check_ = now;
    struct stat st;
    if (stat(path_.c_str(), &st) != 0) return;  // Missing: keep the last good state.
    const bool same = st.st_ino == ino_ && st.st_size == size_ &&
                      st.st_mtim.tv_sec == mtime_.tv_sec && st.st_mtim.tv_nsec == mtime_.tv_nsec;
    if (same && !force) return;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return;
    std::ostringstream text;
    text << in.rdbuf();
    absl::StatusOr<FakeState> parsed = ParseState(text.str());
    if (!parsed.ok()) {
      // Probably caught mid-write; retry at the next check without recording the file identity.
      const bool reported = st.st_ino == bad_ino_ && st.st_size == bad_size_ &&
                            st.st_mtim.tv_sec == bad_mtime_.tv_sec &&
                            st.st_mtim.tv_nsec == bad_mtime_.tv_nsec;
      if (!reported) {
        fprintf(stderr, "fake NVML: keeping previous state, %s: %s\n", path_.c_str(),
                std::string(parsed.status().message()).c_str());
        bad_ino_ = st.st_ino;
        bad_size_ = st.st_size;
        bad_mtime_ = st.st_mtim;
      }
      return;
    }
    state_ = std::move(*parsed);
    ino_ = st.st_ino;
    size_ = st.st_size;
    mtime_ = st.st_mtim;
  }

  std::mutex mu_;
  std::string path_;
  FakeState state_;
  int init_count_ = 0;
  std::chrono::steady_clock::time_point last_check_{};
  ino_t ino_ = 0;
  off_t size_ = -1;
  timespec mtime_{};
  // The last file that failed to parse, reported once.
  ino_t bad_ino_ = 0;
  off_t bad_size_ = -1;
  timespec bad_mtime_{};
  nvml::DeviceOpaque devices_[kMaxGpus];
  NvlinkCounter nvlink_[kMaxGpus];
};

nvml::Return CopyString(const std::string& s, char* out, unsigned int length) {
  if (out == nullptr) return nvml::kErrorInvalidArgument;
  if (s.size() + 1 > length) return nvml::kErrorInsufficientSize;
  memcpy(out, s.c_str(), s.size() + 1);
  return nvml::kSuccess;
}

// Percentages and counters as NVML gives them: whole numbers.
unsigned int AsUint(double v) { return v <= 0 ? 0u : static_cast<unsigned int>(v + 0.5); }

// NOT_SUPPORTED for a field the state leaves out.
template <typename T, typename Convert>
nvml::Return Put(const std::optional<double>& v, T* out, Convert convert) {
  if (out == nullptr) return nvml::kErrorInvalidArgument;
  if (!v.has_value()) return nvml::kErrorNotSupported;
  *out = convert(*v);
  return nvml::kSuccess;
}

[[maybe_unused]] nvml::Return PutUint(const std::optional<double>& v, unsigned int* out) {
  return Put(v, out, AsUint);
}

nvml::Return DeviceGetCount(unsigned int* count) {
  if (count == nullptr) return nvml::kErrorInvalidArgument;
  return Fake::Get().With([&](const FakeState& s) {
    *count = static_cast<unsigned int>(s.gpus.size());
    return nvml::kSuccess;
  });
}

nvml::Return DeviceGetHandleByIndex(unsigned int index, nvml::Device* device) {
  if (device == nullptr) return nvml::kErrorInvalidArgument;
  return Fake::Get().With([&](const FakeState& s) {
    if (index >= s.gpus.size()) return nvml::kErrorInvalidArgument;
    *device = Fake::Get().Handle(index);
    return nvml::kSuccess;
  });
}

[[maybe_unused]] nvml::Return DeviceGetComputeRunningProcesses(nvml::Device device,
                                                               unsigned int* count,
                                                               nvml::ProcessInfoV2* infos) {
  if (count == nullptr) return nvml::kErrorInvalidArgument;
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    if (!g.pids.has_value()) return nvml::kErrorNotSupported;
    const std::vector<unsigned int>& pids = *g.pids;
    if (*count < pids.size() || (infos == nullptr && !pids.empty())) {
      *count = static_cast<unsigned int>(pids.size());
      return nvml::kErrorInsufficientSize;
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      infos[i] = nvml::ProcessInfoV2{pids[i], 0, 0xFFFFFFFFu, 0xFFFFFFFFu};
    }
    *count = static_cast<unsigned int>(pids.size());
    return nvml::kSuccess;
  });
}

[[maybe_unused]] nvml::Return DeviceGetThrottleReasons(nvml::Device device,
                                                       unsigned long long* reasons) {
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    return Put(g.throttle_reasons, reasons,
               [](double v) { return static_cast<unsigned long long>(v); });
  });
}

}  // namespace

#define FAKE_NVML_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_NVML_EXPORT nvml::Return nvmlInit_v2() { return Fake::Get().Init(); }
FAKE_NVML_EXPORT nvml::Return nvmlInit() { return Fake::Get().Init(); }
FAKE_NVML_EXPORT nvml::Return nvmlShutdown() { return Fake::Get().Shutdown(); }

// Not NVML: lets tests check that the loader balances nvmlInit with nvmlShutdown.
FAKE_NVML_EXPORT int stepwatch_fake_nvml_init_count() { return Fake::Get().init_count(); }

FAKE_NVML_EXPORT const char* nvmlErrorString(nvml::Return rc) {
  switch (rc) {
    case nvml::kSuccess:
      return "Success";
    case nvml::kErrorUninitialized:
      return "Uninitialized";
    case nvml::kErrorInvalidArgument:
      return "Invalid Argument";
    case nvml::kErrorNotSupported:
      return "Not Supported";
    case nvml::kErrorInsufficientSize:
      return "Insufficient Size";
    case nvml::kErrorDriverNotLoaded:
      return "Driver Not Loaded";
    default:
      return "Unknown Error";
  }
}

FAKE_NVML_EXPORT nvml::Return nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return Fake::Get().With(
      [&](const FakeState& s) { return CopyString(s.driver_version, version, length); });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetCount_v2(unsigned int* count) {
  return DeviceGetCount(count);
}
FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetCount(unsigned int* count) {
  return DeviceGetCount(count);
}
FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                            nvml::Device* device) {
  return DeviceGetHandleByIndex(index, device);
}
FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetHandleByIndex(unsigned int index, nvml::Device* device) {
  return DeviceGetHandleByIndex(index, device);
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetName(nvml::Device device, char* name,
                                                unsigned int length) {
  return Fake::Get().WithGpu(
      device, [&](const FakeGpu& g, unsigned int) { return CopyString(g.name, name, length); });
}

#ifndef FAKE_NVML_MINIMAL

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetUUID(nvml::Device device, char* uuid,
                                                unsigned int length) {
  return Fake::Get().WithGpu(
      device, [&](const FakeGpu& g, unsigned int) { return CopyString(g.uuid, uuid, length); });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetUtilizationRates(nvml::Device device,
                                                            nvml::Utilization* u) {
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    if (u == nullptr) return nvml::kErrorInvalidArgument;
    if (!g.utilization_gpu.has_value()) return nvml::kErrorNotSupported;
    u->gpu = AsUint(*g.utilization_gpu);
    u->memory = AsUint(g.utilization_memory.value_or(0));
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetMemoryInfo(nvml::Device device, nvml::Memory* m) {
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    if (m == nullptr) return nvml::kErrorInvalidArgument;
    if (!g.memory_total_bytes.has_value()) return nvml::kErrorNotSupported;
    m->total = static_cast<unsigned long long>(*g.memory_total_bytes);
    m->used = static_cast<unsigned long long>(g.memory_used_bytes.value_or(0));
    m->free = m->total > m->used ? m->total - m->used : 0;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetClockInfo(nvml::Device device, unsigned int type,
                                                     unsigned int* clock) {
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    if (type != nvml::kClockSm) return nvml::kErrorNotSupported;
    return PutUint(g.sm_clock_mhz, clock);
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetMaxClockInfo(nvml::Device device, unsigned int type,
                                                        unsigned int* clock) {
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    if (type != nvml::kClockSm) return nvml::kErrorNotSupported;
    return PutUint(g.sm_clock_max_mhz, clock);
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetPowerUsage(nvml::Device device, unsigned int* mw) {
  return Fake::Get().WithGpu(
      device, [&](const FakeGpu& g, unsigned int) { return PutUint(g.power_mw, mw); });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetEnforcedPowerLimit(nvml::Device device,
                                                              unsigned int* mw) {
  return Fake::Get().WithGpu(
      device, [&](const FakeGpu& g, unsigned int) { return PutUint(g.power_limit_mw, mw); });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetTemperature(nvml::Device device, unsigned int sensor,
                                                       unsigned int* temp) {
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    if (sensor != nvml::kTemperatureGpu) return nvml::kErrorNotSupported;
    return PutUint(g.temperature_c, temp);
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetCurrentClocksEventReasons(nvml::Device device,
                                                                     unsigned long long* r) {
  return DeviceGetThrottleReasons(device, r);
}
FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetCurrentClocksThrottleReasons(nvml::Device device,
                                                                        unsigned long long* r) {
  return DeviceGetThrottleReasons(device, r);
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetPcieThroughput(nvml::Device device, unsigned int counter,
                                                          unsigned int* kbps) {
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    if (counter == nvml::kPcieUtilTxBytes) return PutUint(g.pcie_tx_kbps, kbps);
    if (counter == nvml::kPcieUtilRxBytes) return PutUint(g.pcie_rx_kbps, kbps);
    return nvml::kErrorInvalidArgument;
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetFieldValues(nvml::Device device, int count,
                                                       nvml::FieldValue* values) {
  if (count < 0 || (count > 0 && values == nullptr)) return nvml::kErrorInvalidArgument;
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int index) {
    double tx = 0, rx = 0;
    const bool nvlink = g.nvlink_tx_kbps.has_value() || g.nvlink_rx_kbps.has_value();
    if (nvlink) Fake::Get().AdvanceNvlink(index, g, &tx, &rx);
    const long long now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
    for (int i = 0; i < count; ++i) {
      nvml::FieldValue& v = values[i];
      v.timestamp = now_us;
      v.latency_usec = 0;
      v.value_type = nvml::kValueTypeUnsignedLongLong;
      if (nvlink && v.field_id == nvml::kFieldNvlinkThroughputDataTx) {
        v.value.ull_val = static_cast<unsigned long long>(tx);
        v.nvml_return = nvml::kSuccess;
      } else if (nvlink && v.field_id == nvml::kFieldNvlinkThroughputDataRx) {
        v.value.ull_val = static_cast<unsigned long long>(rx);
        v.nvml_return = nvml::kSuccess;
      } else {
        v.nvml_return = nvml::kErrorNotSupported;
      }
    }
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetComputeRunningProcesses_v3(nvml::Device device,
                                                                      unsigned int* count,
                                                                      nvml::ProcessInfoV2* infos) {
  return DeviceGetComputeRunningProcesses(device, count, infos);
}
FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetComputeRunningProcesses_v2(nvml::Device device,
                                                                      unsigned int* count,
                                                                      nvml::ProcessInfoV2* infos) {
  return DeviceGetComputeRunningProcesses(device, count, infos);
}

// GPM: supported on GPUs whose state has any of the three activity fields; the metrics between two
// samples are the state's values at the time of the second sample, as percentages.
FAKE_NVML_EXPORT nvml::Return nvmlGpmQueryDeviceSupport(nvml::Device device,
                                                        nvml::GpmSupport* support) {
  return Fake::Get().WithGpu(device, [&](const FakeGpu& g, unsigned int) {
    if (support == nullptr || support->version != nvml::kGpmSupportVersion) {
      return nvml::kErrorInvalidArgument;
    }
    support->is_supported_device =
        g.sm_activity.has_value() || g.dram_bandwidth.has_value() || g.tensor_activity.has_value();
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlGpmSampleAlloc(nvml::GpmSample* sample) {
  if (sample == nullptr) return nvml::kErrorInvalidArgument;
  *sample = new nvml::GpmSampleOpaque{0, false};
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT nvml::Return nvmlGpmSampleFree(nvml::GpmSample sample) {
  delete sample;
  return nvml::kSuccess;
}

FAKE_NVML_EXPORT nvml::Return nvmlGpmSampleGet(nvml::Device device, nvml::GpmSample sample) {
  if (sample == nullptr) return nvml::kErrorInvalidArgument;
  return Fake::Get().WithGpu(device, [&](const FakeGpu&, unsigned int index) {
    sample->device_index = index;
    sample->taken = true;
    return nvml::kSuccess;
  });
}

FAKE_NVML_EXPORT nvml::Return nvmlGpmMetricsGet(nvml::GpmMetricsGet* get) {
  if (get == nullptr || get->version != nvml::kGpmMetricsGetVersion || get->sample1 == nullptr ||
      get->sample2 == nullptr || !get->sample1->taken || !get->sample2->taken ||
      get->sample1->device_index != get->sample2->device_index ||
      get->num_metrics > static_cast<unsigned int>(nvml::kGpmMetricsCapacity)) {
    return nvml::kErrorInvalidArgument;
  }
  return Fake::Get().With([&](const FakeState& s) {
    if (get->sample2->device_index >= s.gpus.size()) return nvml::kErrorInvalidArgument;
    const FakeGpu& g = s.gpus[get->sample2->device_index];
    for (unsigned int i = 0; i < get->num_metrics; ++i) {
      nvml::GpmMetric& m = get->metrics[i];
      const std::optional<double>* v = nullptr;
      if (m.metric_id == nvml::kGpmMetricSmUtil) v = &g.sm_activity;
      if (m.metric_id == nvml::kGpmMetricDramBwUtil) v = &g.dram_bandwidth;
      if (m.metric_id == nvml::kGpmMetricAnyTensorUtil) v = &g.tensor_activity;
      if (v == nullptr || !v->has_value()) {
        m.nvml_return = nvml::kErrorNotSupported;
        continue;
      }
      m.nvml_return = nvml::kSuccess;
      m.value = **v * 100.0;
    }
    return nvml::kSuccess;
  });
}

#endif  // FAKE_NVML_MINIMAL
