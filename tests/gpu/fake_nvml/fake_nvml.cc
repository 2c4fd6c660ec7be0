// A fake NVML for tests and the demo: the NVML entry points stepwatch uses, answering from a JSON
// state file named by STEPWATCH_FAKE_NVML_STATE (format: docs/fake-nvml.md). The file is re-read
// while running when its mtime, size or inode change (checked at most every 100 ms), so a test can
// change utilization on the fly by replacing it (write a temporary file, then rename). A missing or
// half-written file keeps the last good state.
//
// The state also chooses which real driver to behave like: the process-entry layout of
// nvmlDeviceGetComputeRunningProcesses_v3 follows driver_version (32-byte entries on 535.43 to
// 535.86, not implemented on 535.98), entry points can be made missing, GPM's metric array size
// follows gpm_metric_max, GPUs can be in MIG mode, NVLink counters are per link, health readings
// (PCIe link, ECC, row remapping, NVLink state and errors) follow the state, Xid events appended
// to the state are delivered once through an event set, and any entry point can fail with a
// chosen NVML error on a chosen GPU.
//
// The NVML types below are declared here, independently of gpu/nvml_abi.h, with fixed-width types
// and byte offsets written out from NVIDIA's documentation, so that a layout mistake in the agent's
// declarations is not mirrored here. Where the real driver may write more than the caller asked
// for (the whole GPM metrics array), the fake does, so AddressSanitizer catches an undersized
// buffer in the caller.
//
// Built twice: as the full fake, and with FAKE_NVML_MINIMAL as a driver that exports only the core
// entry points (to test that missing symbols leave metrics unset).
//
// A C library has process-wide state by nature (nvmlInit is global), so the state lives in one
// function-local object guarded by a mutex.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"

namespace fake_nvml {

// nvmlReturn_t values.
enum : int32_t {
  RC_SUCCESS = 0,
  RC_UNINITIALIZED = 1,
  RC_INVALID_ARGUMENT = 2,
  RC_NOT_SUPPORTED = 3,
  RC_NO_PERMISSION = 4,
  RC_INSUFFICIENT_SIZE = 7,
  RC_DRIVER_NOT_LOADED = 9,
  RC_TIMEOUT = 10,
  RC_FUNCTION_NOT_FOUND = 13,
  RC_GPU_IS_LOST = 15,
};

// Handles given out to callers.
struct Gpu {
  uint32_t index;
};
struct GpmSampleRec {
  uint32_t device_index;
  bool taken;
};
// An event set: the GPUs registered in it and how many of each GPU's Xid events it delivered.
struct EventSetRec {
  std::map<uint32_t, size_t> delivered;
};

struct UtilizationRec {  // nvmlUtilization_t
  uint32_t gpu, memory;
};
struct MemoryRec {  // nvmlMemory_t
  uint64_t total, free, used;
};
// Process entries, by the size the emulated driver writes.
struct ProcessRec16 {  // nvmlProcessInfo_v1_t
  uint32_t pid;
  uint32_t pad;
  uint64_t used_memory;
};
struct ProcessRec24 {  // nvmlProcessInfo_v2_t
  uint32_t pid;
  uint32_t pad;
  uint64_t used_memory;
  uint32_t gpu_instance, compute_instance;
};
struct ProcessRec32 {  // nvmlProcessInfo_t of 535.43..535.86
  uint32_t pid;
  uint32_t pad;
  uint64_t used_memory;
  uint32_t gpu_instance, compute_instance;
  uint64_t cc_protected_memory;
};
struct TemperatureRec {  // nvmlTemperature_v1_t
  uint32_t version;
  int32_t sensor;
  int32_t celsius;
};
[[maybe_unused]] constexpr uint32_t kTemperatureRecVersion = 12u | (1u << 24);
struct FieldRec {  // nvmlFieldValue_t
  uint32_t field_id;
  uint32_t scope_id;
  int64_t timestamp_us;
  int64_t latency_us;
  int32_t value_type;
  int32_t ret;
  uint64_t value;  // a union of 8 bytes; written with memcpy per value type
};
struct EventDataRec {  // nvmlEventData_t as nvmlEventSetWait_v2 writes it
  Gpu* device;
  uint64_t event_type;
  uint64_t event_data;
  uint32_t gpu_instance_id, compute_instance_id;
};
struct GpmSupportRec {  // nvmlGpmSupport_t
  uint32_t version, supported;
};
// nvmlGpmMetricsGet_t: a 24-byte head, then NVML_GPM_METRIC_MAX metric records of 40 bytes.
struct GpmGetHead {
  uint32_t version, count;
  GpmSampleRec* sample1;
  GpmSampleRec* sample2;
};
struct GpmMetricRec {
  uint32_t id;
  int32_t ret;
  double value;
  char* names[3];
};
static_assert(sizeof(ProcessRec16) == 16 && sizeof(ProcessRec24) == 24 &&
                  sizeof(ProcessRec32) == 32 && sizeof(TemperatureRec) == 12 &&
                  sizeof(FieldRec) == 40 && sizeof(GpmGetHead) == 24 &&
                  sizeof(GpmMetricRec) == 40 && sizeof(EventDataRec) == 32 &&
                  offsetof(EventDataRec, event_data) == 16,
              "fake NVML records");

// [[maybe_unused]]: the FAKE_NVML_MINIMAL build leaves out the entry points that use these.
[[maybe_unused]] constexpr uint32_t kClockSm = 1;
[[maybe_unused]] constexpr uint32_t kSensorGpu = 0;
[[maybe_unused]] constexpr uint32_t kPcieTx = 0, kPcieRx = 1;
[[maybe_unused]] constexpr uint32_t kFieldNvlinkTx = 138, kFieldNvlinkRx = 139;
[[maybe_unused]] constexpr int32_t kValueTypeUll = 3;
[[maybe_unused]] constexpr uint32_t kGpmMetricsGetVersion = 1, kGpmSupportVersion = 1;
[[maybe_unused]] constexpr uint32_t kGpmSmUtil = 2, kGpmAnyTensorUtil = 5, kGpmDramBwUtil = 10;
// nvmlMemoryErrorType_t (corrected 0, uncorrected 1), nvmlEccCounterType_t (volatile 0,
// aggregate 1), nvmlNvLinkErrorCounter_t (replay 0, recovery 1, CRC flit 2, CRC data 3).
[[maybe_unused]] constexpr uint32_t kEccUncorrected = 1, kEccAggregate = 1;
[[maybe_unused]] constexpr uint32_t kNvlinkErrorCounters = 4;
[[maybe_unused]] constexpr uint64_t kEventTypeXid = 0x8;

}  // namespace fake_nvml

namespace {

using namespace fake_nvml;  // NOLINT: the fake's own NVML declarations, above.
namespace json = stepwatch::json;

constexpr unsigned int kMaxGpus = 64;
constexpr unsigned int kMaxLinks = 64;
constexpr auto kRecheckPeriod = std::chrono::milliseconds(100);

struct FakeGpu {
  std::string name;
  std::string uuid;
  std::optional<double> utilization_gpu, utilization_memory;
  std::optional<double> memory_used_bytes, memory_total_bytes;
  std::optional<double> sm_clock_mhz, sm_clock_max_mhz;
  std::optional<double> power_mw, power_limit_mw, temperature_c;
  std::optional<double> throttle_reasons;
  std::optional<double> pcie_tx_kbps, pcie_rx_kbps;
  // Per-link NVLink rates, KiB/s (from nvlink_*_kbps_per_link, or the totals split evenly).
  std::vector<double> nvlink_tx_link_kbps, nvlink_rx_link_kbps;
  std::optional<double> sm_activity, dram_bandwidth, tensor_activity;
  std::optional<std::vector<unsigned int>> pids;
  bool mig = false;
  // Health (docs/fake-nvml.md): PCIe link and replays, ECC, row remapping.
  std::optional<double> pcie_link_gen, pcie_link_gen_max, pcie_link_gen_gpu_max;
  std::optional<double> pcie_link_width, pcie_link_width_max, pcie_replays;
  // [uncorrected][aggregate]
  std::optional<double> ecc[2][2];
  std::optional<double> remapped_rows_corrected, remapped_rows_uncorrected;
  std::optional<double> remapped_rows_pending, remapped_rows_failure;
  // Per NVLink: 1 up, 0 down (the GPU's links); error counters by nvmlNvLinkErrorCounter_t.
  std::vector<double> nvlink_up;
  std::vector<double> nvlink_errors[kNvlinkErrorCounters];
  // Every Xid event of this GPU so far, oldest first; an event set delivers those added after
  // the GPU was registered in it.
  std::vector<double> xids;
  // Entry point name -> the NVML error it returns on this GPU.
  std::map<std::string, int32_t> errors;
};

struct FakeState {
  std::string driver_version = "fake";
  bool fail_init = false;
  // Entry points that behave as absent: they return NVML_ERROR_FUNCTION_NOT_FOUND.
  std::set<std::string> missing_functions;
  // NVML_GPM_METRIC_MAX of the emulated driver: nvmlGpmMetricsGet writes that many records.
  unsigned int gpm_metric_max = 333;
  std::vector<FakeGpu> gpus;
};

// NVLink counters keep running across state reloads, as the driver's would.
struct NvlinkCounter {
  double tx_kib[kMaxLinks] = {};
  double rx_kib[kMaxLinks] = {};
  std::chrono::steady_clock::time_point last{};
};

absl::Status ReadNumber(const json::Value& obj, const char* key, std::optional<double>* out) {
  const json::Value* v = obj.Find(key);
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (!v->is_number()) return absl::InvalidArgumentError(absl::StrCat(key, " must be a number"));
  *out = v->as_double();
  return absl::OkStatus();
}

absl::Status ReadNumbers(const json::Value& obj, const char* key, std::vector<double>* out) {
  const json::Value* v = obj.Find(key);
  if (v == nullptr || v->is_null()) return absl::OkStatus();
  if (!v->is_array() || v->as_array().size() > kMaxLinks) {
    return absl::InvalidArgumentError(absl::StrCat(key, " must be an array of at most 64 numbers"));
  }
  out->clear();
  for (const json::Value& x : v->as_array()) {
    if (!x.is_number()) return absl::InvalidArgumentError(absl::StrCat(key, " must hold numbers"));
    out->push_back(x.as_double());
  }
  return absl::OkStatus();
}

// Per-link rates: explicit per-link arrays win; otherwise a total is split over nvlink_links links.
absl::Status ReadNvlink(const json::Value& g, FakeGpu* gpu) {
  std::optional<double> tx, rx, links;
  for (auto [key, out] : {std::pair{"nvlink_tx_kbps", &tx}, std::pair{"nvlink_rx_kbps", &rx},
                          std::pair{"nvlink_links", &links}}) {
    absl::Status s = ReadNumber(g, key, out);
    if (!s.ok()) return s;
  }
  const unsigned int n = links.has_value() ? static_cast<unsigned int>(*links) : 18;
  if (n == 0 || n > kMaxLinks) return absl::InvalidArgumentError("nvlink_links must be 1..64");
  if (tx.has_value() || rx.has_value()) {
    gpu->nvlink_tx_link_kbps.assign(n, tx.value_or(0) / n);
    gpu->nvlink_rx_link_kbps.assign(n, rx.value_or(0) / n);
  }
  absl::Status s = ReadNumbers(g, "nvlink_tx_kbps_per_link", &gpu->nvlink_tx_link_kbps);
  if (s.ok()) s = ReadNumbers(g, "nvlink_rx_kbps_per_link", &gpu->nvlink_rx_link_kbps);
  if (!s.ok()) return s;
  // Both directions have the same links.
  const size_t count = std::max(gpu->nvlink_tx_link_kbps.size(), gpu->nvlink_rx_link_kbps.size());
  gpu->nvlink_tx_link_kbps.resize(count, 0);
  gpu->nvlink_rx_link_kbps.resize(count, 0);
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
  if (const json::Value* v = root.Find("missing_functions"); v != nullptr && !v->is_null()) {
    if (!v->is_array()) return absl::InvalidArgumentError("missing_functions must be an array");
    for (const json::Value& f : v->as_array()) {
      if (!f.is_string()) return absl::InvalidArgumentError("missing_functions holds names");
      state.missing_functions.insert(f.as_string());
    }
  }
  std::optional<double> gpm_max;
  if (absl::Status s = ReadNumber(root, "gpm_metric_max", &gpm_max); !s.ok()) return s;
  if (gpm_max.has_value()) {
    if (*gpm_max < 1 || *gpm_max > 1024) return absl::InvalidArgumentError("gpm_metric_max");
    state.gpm_metric_max = static_cast<unsigned int>(*gpm_max);
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
        {"sm_activity", &gpu.sm_activity},
        {"dram_bandwidth", &gpu.dram_bandwidth},
        {"tensor_activity", &gpu.tensor_activity},
        {"pcie_link_gen", &gpu.pcie_link_gen},
        {"pcie_link_gen_max", &gpu.pcie_link_gen_max},
        {"pcie_link_gen_gpu_max", &gpu.pcie_link_gen_gpu_max},
        {"pcie_link_width", &gpu.pcie_link_width},
        {"pcie_link_width_max", &gpu.pcie_link_width_max},
        {"pcie_replays", &gpu.pcie_replays},
        {"ecc_corrected_volatile", &gpu.ecc[0][0]},
        {"ecc_uncorrected_volatile", &gpu.ecc[1][0]},
        {"ecc_corrected_aggregate", &gpu.ecc[0][1]},
        {"ecc_uncorrected_aggregate", &gpu.ecc[1][1]},
        {"remapped_rows_corrected", &gpu.remapped_rows_corrected},
        {"remapped_rows_uncorrected", &gpu.remapped_rows_uncorrected},
        {"remapped_rows_pending", &gpu.remapped_rows_pending},
        {"remapped_rows_failure", &gpu.remapped_rows_failure},
    };
    for (const Field& f : fields) {
      absl::Status s = ReadNumber(g, f.key, f.out);
      if (!s.ok()) return s;
    }
    if (absl::Status s = ReadNvlink(g, &gpu); !s.ok()) return s;
    const std::pair<const char*, std::vector<double>*> arrays[] = {
        {"nvlink_up", &gpu.nvlink_up},
        {"nvlink_replay_errors", &gpu.nvlink_errors[0]},
        {"nvlink_recovery_errors", &gpu.nvlink_errors[1]},
        {"nvlink_crc_flit_errors", &gpu.nvlink_errors[2]},
        {"nvlink_crc_data_errors", &gpu.nvlink_errors[3]},
        {"xids", &gpu.xids},
    };
    for (const auto& [key, out] : arrays) {
      if (absl::Status s = ReadNumbers(g, key, out); !s.ok()) return s;
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
    if (const json::Value* v = g.Find("mig_mode"); v != nullptr && !v->is_null()) {
      if (!v->is_number()) return absl::InvalidArgumentError("mig_mode must be 0 or 1");
      gpu.mig = v->as_double() != 0;
    }
    if (const json::Value* v = g.Find("errors"); v != nullptr && !v->is_null()) {
      if (!v->is_object()) return absl::InvalidArgumentError("errors must be an object");
      for (const auto& [name, code] : v->as_object()) {
        if (!code.is_number() || !code.is_integer()) {
          return absl::InvalidArgumentError("errors maps entry points to NVML error numbers");
        }
        gpu.errors[name] = static_cast<int32_t>(code.as_int64());
      }
    }
    state.gpus.push_back(std::move(gpu));
  }
  return state;
}

// Bytes per entry that the emulated driver's nvmlDeviceGetComputeRunningProcesses_v3 writes: 32 on
// 535.43..535.86, 0 (not implemented) on 535.98, 24 otherwise.
unsigned int V3EntryBytes(const std::string& driver_version) {
  unsigned int major = 0, minor = 0;
  if (sscanf(driver_version.c_str(), "%u.%u", &major, &minor) != 2 || major != 535) return 24;
  if (minor == 98) return 0;
  return minor >= 43 && minor <= 86 ? 32 : 24;
}

class Fake {
 public:
  static Fake& Get() {
    // Destroyed when the library is unloaded (dlclose) or at exit.
    static Fake fake;
    return fake;
  }

  int32_t Init() {
    std::lock_guard<std::mutex> lock(mu_);
    const char* path = getenv("STEPWATCH_FAKE_NVML_STATE");
    if (path == nullptr || *path == '\0') return RC_DRIVER_NOT_LOADED;
    path_ = path;
    ReloadLocked(/*force=*/true);
    if (state_.fail_init) return RC_DRIVER_NOT_LOADED;
    ++init_count_;
    return RC_SUCCESS;
  }

  int32_t Shutdown() {
    std::lock_guard<std::mutex> lock(mu_);
    if (init_count_ == 0) return RC_UNINITIALIZED;
    --init_count_;
    return RC_SUCCESS;
  }

  int init_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return init_count_;
  }

  // Runs `fn(state)` on a fresh view of the state; UNINITIALIZED before nvmlInit,
  // FUNCTION_NOT_FOUND for an entry point the state lists as missing.
  template <typename Fn>
  int32_t With(const char* function, Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (init_count_ == 0) return RC_UNINITIALIZED;
    ReloadLocked(/*force=*/false);
    if (state_.missing_functions.count(function) > 0) return RC_FUNCTION_NOT_FOUND;
    return fn(state_);
  }

  // Same, for one GPU; INVALID_ARGUMENT for a handle that is not (or no longer) a GPU, and the
  // error the state chose for this entry point on this GPU.
  template <typename Fn>
  int32_t WithGpu(const char* function, Gpu* device, Fn fn) {
    return With(function, [&](const FakeState& state) -> int32_t {
      if (device == nullptr || device->index >= state.gpus.size()) return RC_INVALID_ARGUMENT;
      const FakeGpu& gpu = state.gpus[device->index];
      if (auto it = gpu.errors.find(function); it != gpu.errors.end()) return it->second;
      return fn(state, gpu, device->index);
    });
  }

  Gpu* Handle(unsigned int index) { return &devices_[index]; }

  // Records a GPM sample of GPU `index` (caller holds no lock; called inside With).
  void NoteGpmSample(unsigned int index) {
    auto now = std::chrono::steady_clock::now();
    if (gpm_last_[index] != std::chrono::steady_clock::time_point{}) {
      const int64_t gap =
          std::chrono::duration_cast<std::chrono::microseconds>(now - gpm_last_[index]).count();
      if (gpm_min_gap_us_ < 0 || gap < gpm_min_gap_us_) gpm_min_gap_us_ = gap;
    }
    gpm_last_[index] = now;
  }
  int64_t gpm_min_gap_us() {
    std::lock_guard<std::mutex> lock(mu_);
    return gpm_min_gap_us_;
  }

  // Records the timeout of an nvmlEventSetWait_v2 call (called inside With).
  void NoteEventWait(unsigned int timeout_ms) {
    if (static_cast<int64_t>(timeout_ms) > max_event_wait_ms_) max_event_wait_ms_ = timeout_ms;
  }
  int64_t max_event_wait_ms() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_event_wait_ms_;
  }

  // Cumulative per-link KiB, integrated from the configured rates since the previous query.
  const NvlinkCounter& AdvanceNvlink(unsigned int index, const FakeGpu& gpu) {
    NvlinkCounter& c = nvlink_[index];
    auto now = std::chrono::steady_clock::now();
    if (c.last != std::chrono::steady_clock::time_point{}) {
      double dt = std::chrono::duration<double>(now - c.last).count();
      for (size_t l = 0; l < gpu.nvlink_tx_link_kbps.size() && l < kMaxLinks; ++l) {
        c.tx_kib[l] += gpu.nvlink_tx_link_kbps[l] * dt;
        c.rx_kib[l] += gpu.nvlink_rx_link_kbps[l] * dt;
      }
    }
    c.last = now;
    return c;
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

  // std::mutex, unannotated: a test stand-in for a C library (NVML), exempt from the
  // absl::Mutex + -Wthread-safety rule that stepwatch's own code follows.
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
  Gpu devices_[kMaxGpus];
  NvlinkCounter nvlink_[kMaxGpus];
  std::chrono::steady_clock::time_point gpm_last_[kMaxGpus] = {};
  int64_t gpm_min_gap_us_ = -1;
  int64_t max_event_wait_ms_ = -1;
};

int32_t CopyString(const std::string& s, char* out, unsigned int length) {
  if (out == nullptr) return RC_INVALID_ARGUMENT;
  if (s.size() + 1 > length) return RC_INSUFFICIENT_SIZE;
  memcpy(out, s.c_str(), s.size() + 1);
  return RC_SUCCESS;
}

// Percentages and counters as NVML gives them: whole numbers.
unsigned int AsUint(double v) { return v <= 0 ? 0u : static_cast<unsigned int>(v + 0.5); }

// NOT_SUPPORTED for a field the state leaves out.
[[maybe_unused]] int32_t PutUint(const std::optional<double>& v, unsigned int* out) {
  if (out == nullptr) return RC_INVALID_ARGUMENT;
  if (!v.has_value()) return RC_NOT_SUPPORTED;
  *out = AsUint(*v);
  return RC_SUCCESS;
}

int32_t DeviceGetCount(const char* function, unsigned int* count) {
  if (count == nullptr) return RC_INVALID_ARGUMENT;
  return Fake::Get().With(function, [&](const FakeState& s) {
    *count = static_cast<unsigned int>(s.gpus.size());
    return RC_SUCCESS;
  });
}

int32_t DeviceGetHandleByIndex(const char* function, unsigned int index, Gpu** device) {
  if (device == nullptr) return RC_INVALID_ARGUMENT;
  return Fake::Get().With(function, [&](const FakeState& s) {
    if (index >= s.gpus.size()) return RC_INVALID_ARGUMENT;
    *device = Fake::Get().Handle(index);
    return RC_SUCCESS;
  });
}

// Writes entries of `entry_bytes` (16, 24 or 32), as the emulated driver's entry point does: as
// many as the caller says fit, with no regard to how large the caller's entries are.
[[maybe_unused]] int32_t RunningProcesses(const char* function, Gpu* device, unsigned int* count,
                                          void* infos, unsigned int v3_entry_bytes_or_fixed) {
  if (count == nullptr) return RC_INVALID_ARGUMENT;
  return Fake::Get().WithGpu(function, device,
                             [&](const FakeState& state, const FakeGpu& g, unsigned int) {
                               unsigned int entry_bytes = v3_entry_bytes_or_fixed;
                               if (entry_bytes == 0)
                                 entry_bytes = V3EntryBytes(state.driver_version);
                               if (entry_bytes == 0) return int32_t{RC_FUNCTION_NOT_FOUND};
                               if (!g.pids.has_value()) return int32_t{RC_NOT_SUPPORTED};
                               const std::vector<unsigned int>& pids = *g.pids;
                               if (*count < pids.size() || (infos == nullptr && !pids.empty())) {
                                 *count = static_cast<unsigned int>(pids.size());
                                 return int32_t{RC_INSUFFICIENT_SIZE};
                               }
                               auto* out = static_cast<unsigned char*>(infos);
                               for (size_t i = 0; i < pids.size(); ++i) {
                                 const uint64_t memory = (i + 1) * (uint64_t{1} << 20);
                                 // On a MIG GPU processes run in instance 1, compute instance 0;
                                 // otherwise N/A (~0u).
                                 const uint32_t gi = g.mig ? 1 : 0xFFFFFFFFu;
                                 const uint32_t ci = g.mig ? 0 : 0xFFFFFFFFu;
                                 if (entry_bytes == 16) {
                                   const ProcessRec16 r{pids[i], 0, memory};
                                   memcpy(out + i * sizeof(r), &r, sizeof(r));
                                 } else if (entry_bytes == 24) {
                                   const ProcessRec24 r{pids[i], 0, memory, gi, ci};
                                   memcpy(out + i * sizeof(r), &r, sizeof(r));
                                 } else {
                                   const ProcessRec32 r{pids[i], 0, memory, gi, ci, memory / 2};
                                   memcpy(out + i * sizeof(r), &r, sizeof(r));
                                 }
                               }
                               *count = static_cast<unsigned int>(pids.size());
                               return int32_t{RC_SUCCESS};
                             });
}

[[maybe_unused]] int32_t ThrottleReasons(const char* function, Gpu* device, uint64_t* reasons) {
  return Fake::Get().WithGpu(function, device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (reasons == nullptr) return int32_t{RC_INVALID_ARGUMENT};
                               if (!g.throttle_reasons) return int32_t{RC_NOT_SUPPORTED};
                               *reasons = static_cast<uint64_t>(*g.throttle_reasons);
                               return int32_t{RC_SUCCESS};
                             });
}

}  // namespace

#define FAKE_NVML_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_NVML_EXPORT int32_t nvmlInit_v2() { return Fake::Get().Init(); }
FAKE_NVML_EXPORT int32_t nvmlInit() { return Fake::Get().Init(); }
FAKE_NVML_EXPORT int32_t nvmlShutdown() { return Fake::Get().Shutdown(); }

// Not NVML: lets tests check that the loader balances nvmlInit with nvmlShutdown.
FAKE_NVML_EXPORT int stepwatch_fake_nvml_init_count() { return Fake::Get().init_count(); }
// Not NVML: the shortest time between two nvmlGpmSampleGet calls for one GPU, microseconds (-1:
// fewer than two), to check that the loader keeps NVIDIA's 100 ms GPM minimum.
FAKE_NVML_EXPORT int64_t stepwatch_fake_nvml_gpm_min_gap_us() {
  return Fake::Get().gpm_min_gap_us();
}
// Not NVML: the longest timeout any nvmlEventSetWait_v2 call asked for, milliseconds (-1: none),
// to check that the loader never waits for events.
FAKE_NVML_EXPORT int64_t stepwatch_fake_nvml_max_event_wait_ms() {
  return Fake::Get().max_event_wait_ms();
}

FAKE_NVML_EXPORT const char* nvmlErrorString(int32_t rc) {
  switch (rc) {
    case RC_SUCCESS:
      return "Success";
    case RC_UNINITIALIZED:
      return "Uninitialized";
    case RC_INVALID_ARGUMENT:
      return "Invalid Argument";
    case RC_NOT_SUPPORTED:
      return "Not Supported";
    case RC_NO_PERMISSION:
      return "Insufficient Permissions";
    case RC_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case RC_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case RC_TIMEOUT:
      return "Timeout";
    case RC_FUNCTION_NOT_FOUND:
      return "Function Not Found";
    case RC_GPU_IS_LOST:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

FAKE_NVML_EXPORT int32_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  return Fake::Get().With("nvmlSystemGetDriverVersion", [&](const FakeState& s) {
    return CopyString(s.driver_version, version, length);
  });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetCount_v2(unsigned int* count) {
  return DeviceGetCount("nvmlDeviceGetCount_v2", count);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetCount(unsigned int* count) {
  return DeviceGetCount("nvmlDeviceGetCount", count);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, Gpu** device) {
  return DeviceGetHandleByIndex("nvmlDeviceGetHandleByIndex_v2", index, device);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetHandleByIndex(unsigned int index, Gpu** device) {
  return DeviceGetHandleByIndex("nvmlDeviceGetHandleByIndex", index, device);
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetName(Gpu* device, char* name, unsigned int length) {
  return Fake::Get().WithGpu("nvmlDeviceGetName", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               return CopyString(g.name, name, length);
                             });
}

#ifndef FAKE_NVML_MINIMAL

FAKE_NVML_EXPORT int32_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  return Fake::Get().With("nvmlSystemGetNVMLVersion", [&](const FakeState& s) {
    // NVML versions read "<CUDA major>.<driver version>", e.g. 12.550.54.15.
    return CopyString(absl::StrCat("12.", s.driver_version), version, length);
  });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetUUID(Gpu* device, char* uuid, unsigned int length) {
  return Fake::Get().WithGpu("nvmlDeviceGetUUID", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               // The documented buffer is NVML_DEVICE_UUID_V2_BUFFER_SIZE (96); a
                               // smaller one is refused as the driver refuses it.
                               if (length < 96) return int32_t{RC_INSUFFICIENT_SIZE};
                               return CopyString(g.uuid, uuid, length);
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetMigMode(Gpu* device, unsigned int* current,
                                              unsigned int* pending) {
  return Fake::Get().WithGpu("nvmlDeviceGetMigMode", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (current == nullptr || pending == nullptr) {
                                 return int32_t{RC_INVALID_ARGUMENT};
                               }
                               *current = *pending = g.mig ? 1 : 0;
                               return int32_t{RC_SUCCESS};
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetUtilizationRates(Gpu* device, UtilizationRec* u) {
  return Fake::Get().WithGpu("nvmlDeviceGetUtilizationRates", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (u == nullptr) return int32_t{RC_INVALID_ARGUMENT};
                               // A GPU in MIG mode has no device-wide utilization.
                               if (g.mig || !g.utilization_gpu.has_value())
                                 return int32_t{RC_NOT_SUPPORTED};
                               u->gpu = AsUint(*g.utilization_gpu);
                               u->memory = AsUint(g.utilization_memory.value_or(0));
                               return int32_t{RC_SUCCESS};
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetMemoryInfo(Gpu* device, MemoryRec* m) {
  return Fake::Get().WithGpu("nvmlDeviceGetMemoryInfo", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (m == nullptr) return int32_t{RC_INVALID_ARGUMENT};
                               if (!g.memory_total_bytes.has_value())
                                 return int32_t{RC_NOT_SUPPORTED};
                               m->total = static_cast<uint64_t>(*g.memory_total_bytes);
                               m->used = static_cast<uint64_t>(g.memory_used_bytes.value_or(0));
                               m->free = m->total > m->used ? m->total - m->used : 0;
                               return int32_t{RC_SUCCESS};
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetClockInfo(Gpu* device, uint32_t type, unsigned int* clock) {
  return Fake::Get().WithGpu("nvmlDeviceGetClockInfo", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (type != kClockSm) return int32_t{RC_NOT_SUPPORTED};
                               return PutUint(g.sm_clock_mhz, clock);
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetMaxClockInfo(Gpu* device, uint32_t type,
                                                   unsigned int* clock) {
  return Fake::Get().WithGpu("nvmlDeviceGetMaxClockInfo", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (type != kClockSm) return int32_t{RC_NOT_SUPPORTED};
                               return PutUint(g.sm_clock_max_mhz, clock);
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetPowerUsage(Gpu* device, unsigned int* mw) {
  return Fake::Get().WithGpu(
      "nvmlDeviceGetPowerUsage", device,
      [&](const FakeState&, const FakeGpu& g, unsigned int) { return PutUint(g.power_mw, mw); });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetEnforcedPowerLimit(Gpu* device, unsigned int* mw) {
  return Fake::Get().WithGpu("nvmlDeviceGetEnforcedPowerLimit", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               return PutUint(g.power_limit_mw, mw);
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetTemperature(Gpu* device, uint32_t sensor,
                                                  unsigned int* temp) {
  return Fake::Get().WithGpu("nvmlDeviceGetTemperature", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (sensor != kSensorGpu) return int32_t{RC_NOT_SUPPORTED};
                               return PutUint(g.temperature_c, temp);
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetTemperatureV(Gpu* device, TemperatureRec* t) {
  return Fake::Get().WithGpu("nvmlDeviceGetTemperatureV", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               // The driver checks the struct version, which encodes the struct
                               // size.
                               if (t == nullptr || t->version != kTemperatureRecVersion) {
                                 return int32_t{RC_INVALID_ARGUMENT};
                               }
                               if (t->sensor != static_cast<int32_t>(kSensorGpu))
                                 return int32_t{RC_NOT_SUPPORTED};
                               if (!g.temperature_c.has_value()) return int32_t{RC_NOT_SUPPORTED};
                               t->celsius = static_cast<int32_t>(AsUint(*g.temperature_c));
                               return int32_t{RC_SUCCESS};
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetCurrentClocksEventReasons(Gpu* device, uint64_t* r) {
  return ThrottleReasons("nvmlDeviceGetCurrentClocksEventReasons", device, r);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetCurrentClocksThrottleReasons(Gpu* device, uint64_t* r) {
  return ThrottleReasons("nvmlDeviceGetCurrentClocksThrottleReasons", device, r);
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetPcieThroughput(Gpu* device, uint32_t counter,
                                                     unsigned int* kbps) {
  return Fake::Get().WithGpu("nvmlDeviceGetPcieThroughput", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (counter == kPcieTx) return PutUint(g.pcie_tx_kbps, kbps);
                               if (counter == kPcieRx) return PutUint(g.pcie_rx_kbps, kbps);
                               return int32_t{RC_INVALID_ARGUMENT};
                             });
}

// NVLink throughput fields are per link: scopeId n reads link n, scopeId UINT_MAX the sum.
FAKE_NVML_EXPORT int32_t nvmlDeviceGetFieldValues(Gpu* device, int count, FieldRec* values) {
  if (count < 0 || (count > 0 && values == nullptr)) return RC_INVALID_ARGUMENT;
  return Fake::Get().WithGpu("nvmlDeviceGetFieldValues", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int index) {
                               const size_t links = g.nvlink_tx_link_kbps.size();
                               const NvlinkCounter& c = Fake::Get().AdvanceNvlink(index, g);
                               const int64_t now_us =
                                   std::chrono::duration_cast<std::chrono::microseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count();
                               for (int i = 0; i < count; ++i) {
                                 FieldRec& v = values[i];
                                 v.timestamp_us = now_us;
                                 v.latency_us = 0;
                                 v.value_type = kValueTypeUll;
                                 v.value = 0;
                                 const double* kib = v.field_id == kFieldNvlinkTx   ? c.tx_kib
                                                     : v.field_id == kFieldNvlinkRx ? c.rx_kib
                                                                                    : nullptr;
                                 if (kib == nullptr || links == 0) {
                                   v.ret = RC_NOT_SUPPORTED;
                                   continue;
                                 }
                                 if (v.scope_id == UINT_MAX) {
                                   double sum = 0;
                                   for (size_t l = 0; l < links; ++l) sum += kib[l];
                                   v.value = static_cast<uint64_t>(sum);
                                 } else if (v.scope_id < links) {
                                   v.value = static_cast<uint64_t>(kib[v.scope_id]);
                                 } else {
                                   v.ret = RC_INVALID_ARGUMENT;
                                   continue;
                                 }
                                 v.ret = RC_SUCCESS;
                               }
                               return int32_t{RC_SUCCESS};
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetComputeRunningProcesses_v3(Gpu* device, unsigned int* count,
                                                                 void* infos) {
  return RunningProcesses("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos, 0);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetComputeRunningProcesses_v2(Gpu* device, unsigned int* count,
                                                                 void* infos) {
  return RunningProcesses("nvmlDeviceGetComputeRunningProcesses_v2", device, count, infos, 24);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetComputeRunningProcesses(Gpu* device, unsigned int* count,
                                                              void* infos) {
  return RunningProcesses("nvmlDeviceGetComputeRunningProcesses", device, count, infos, 16);
}

// GPM: supported on GPUs whose state has any of the three activity fields; the metrics between two
// samples are the state's values at the time of the second sample, as percentages.
FAKE_NVML_EXPORT int32_t nvmlGpmQueryDeviceSupport(Gpu* device, GpmSupportRec* support) {
  return Fake::Get().WithGpu(
      "nvmlGpmQueryDeviceSupport", device, [&](const FakeState&, const FakeGpu& g, unsigned int) {
        if (support == nullptr || support->version != kGpmSupportVersion) {
          return int32_t{RC_INVALID_ARGUMENT};
        }
        support->supported = g.sm_activity.has_value() || g.dram_bandwidth.has_value() ||
                             g.tensor_activity.has_value();
        return int32_t{RC_SUCCESS};
      });
}

FAKE_NVML_EXPORT int32_t nvmlGpmSampleAlloc(GpmSampleRec** sample) {
  if (sample == nullptr) return RC_INVALID_ARGUMENT;
  return Fake::Get().With("nvmlGpmSampleAlloc", [&](const FakeState&) {
    *sample = new GpmSampleRec{0, false};
    return int32_t{RC_SUCCESS};
  });
}

FAKE_NVML_EXPORT int32_t nvmlGpmSampleFree(GpmSampleRec* sample) {
  delete sample;
  return RC_SUCCESS;
}

FAKE_NVML_EXPORT int32_t nvmlGpmSampleGet(Gpu* device, GpmSampleRec* sample) {
  if (sample == nullptr) return RC_INVALID_ARGUMENT;
  return Fake::Get().WithGpu("nvmlGpmSampleGet", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int index) {
                               if (g.mig) return int32_t{RC_NOT_SUPPORTED};
                               Fake::Get().NoteGpmSample(index);
                               sample->device_index = index;
                               sample->taken = true;
                               return int32_t{RC_SUCCESS};
                             });
}

// Writes every one of the emulated driver's gpm_metric_max records (those not asked for are
// cleared), as a driver that treats the struct as its own full size may.
FAKE_NVML_EXPORT int32_t nvmlGpmMetricsGet(GpmGetHead* get) {
  if (get == nullptr || get->version != kGpmMetricsGetVersion || get->sample1 == nullptr ||
      get->sample2 == nullptr || !get->sample1->taken || !get->sample2->taken ||
      get->sample1->device_index != get->sample2->device_index) {
    return RC_INVALID_ARGUMENT;
  }
  return Fake::Get().With("nvmlGpmMetricsGet", [&](const FakeState& s) {
    if (get->sample2->device_index >= s.gpus.size() || get->count > s.gpm_metric_max) {
      return int32_t{RC_INVALID_ARGUMENT};
    }
    const FakeGpu& g = s.gpus[get->sample2->device_index];
    if (auto it = g.errors.find("nvmlGpmMetricsGet"); it != g.errors.end()) return it->second;
    auto* records =
        reinterpret_cast<GpmMetricRec*>(reinterpret_cast<unsigned char*>(get) + sizeof(GpmGetHead));
    for (unsigned int i = 0; i < s.gpm_metric_max; ++i) {
      GpmMetricRec m;
      memcpy(&m, &records[i], sizeof(m));
      if (i >= get->count) {
        memset(&records[i], 0, sizeof(m));
        continue;
      }
      const std::optional<double>* v = nullptr;
      if (m.id == kGpmSmUtil) v = &g.sm_activity;
      if (m.id == kGpmDramBwUtil) v = &g.dram_bandwidth;
      if (m.id == kGpmAnyTensorUtil) v = &g.tensor_activity;
      if (v == nullptr || !v->has_value()) {
        m.ret = RC_NOT_SUPPORTED;
      } else {
        m.ret = RC_SUCCESS;
        m.value = **v * 100.0;
      }
      memcpy(&records[i], &m, sizeof(m));
    }
    return int32_t{RC_SUCCESS};
  });
}

// Health. A field the state leaves out makes its entry point return NOT_SUPPORTED.
namespace {

[[maybe_unused]] int32_t GpuUint(const char* function, Gpu* device,
                                 std::optional<double> FakeGpu::*field, unsigned int* out) {
  return Fake::Get().WithGpu(
      function, device,
      [&](const FakeState&, const FakeGpu& g, unsigned int) { return PutUint(g.*field, out); });
}

// The value of link `link` in a per-link array: INVALID_ARGUMENT past the GPU's links,
// NOT_SUPPORTED when the array is absent.
[[maybe_unused]] int32_t LinkValue(const FakeGpu& g, const std::vector<double>& values,
                                   unsigned int link, double* out) {
  if (g.nvlink_up.empty() && values.empty()) return RC_NOT_SUPPORTED;
  if (link >= std::max(g.nvlink_up.size(), values.size())) return RC_INVALID_ARGUMENT;
  if (link >= values.size()) return RC_NOT_SUPPORTED;
  *out = values[link];
  return RC_SUCCESS;
}

}  // namespace

FAKE_NVML_EXPORT int32_t nvmlDeviceGetCurrPcieLinkGeneration(Gpu* device, unsigned int* gen) {
  return GpuUint("nvmlDeviceGetCurrPcieLinkGeneration", device, &FakeGpu::pcie_link_gen, gen);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetMaxPcieLinkGeneration(Gpu* device, unsigned int* gen) {
  return GpuUint("nvmlDeviceGetMaxPcieLinkGeneration", device, &FakeGpu::pcie_link_gen_max, gen);
}
// The GPU's own maximum; defaults to pcie_link_gen_max (a slot as fast as the GPU).
FAKE_NVML_EXPORT int32_t nvmlDeviceGetGpuMaxPcieLinkGeneration(Gpu* device, unsigned int* gen) {
  return Fake::Get().WithGpu("nvmlDeviceGetGpuMaxPcieLinkGeneration", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               return PutUint(g.pcie_link_gen_gpu_max.has_value()
                                                  ? g.pcie_link_gen_gpu_max
                                                  : g.pcie_link_gen_max,
                                              gen);
                             });
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetCurrPcieLinkWidth(Gpu* device, unsigned int* width) {
  return GpuUint("nvmlDeviceGetCurrPcieLinkWidth", device, &FakeGpu::pcie_link_width, width);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetMaxPcieLinkWidth(Gpu* device, unsigned int* width) {
  return GpuUint("nvmlDeviceGetMaxPcieLinkWidth", device, &FakeGpu::pcie_link_width_max, width);
}
FAKE_NVML_EXPORT int32_t nvmlDeviceGetPcieReplayCounter(Gpu* device, unsigned int* value) {
  return GpuUint("nvmlDeviceGetPcieReplayCounter", device, &FakeGpu::pcie_replays, value);
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetTotalEccErrors(Gpu* device, uint32_t error_type,
                                                     uint32_t counter_type, uint64_t* count) {
  return Fake::Get().WithGpu(
      "nvmlDeviceGetTotalEccErrors", device, [&](const FakeState&, const FakeGpu& g, unsigned int) {
        if (count == nullptr || error_type > kEccUncorrected || counter_type > kEccAggregate) {
          return int32_t{RC_INVALID_ARGUMENT};
        }
        const std::optional<double>& v = g.ecc[error_type][counter_type];
        if (!v.has_value()) return int32_t{RC_NOT_SUPPORTED};
        *count = static_cast<uint64_t>(*v);
        return int32_t{RC_SUCCESS};
      });
}

// Supported when the state has remapped_rows_corrected; the other three default to 0.
FAKE_NVML_EXPORT int32_t nvmlDeviceGetRemappedRows(Gpu* device, unsigned int* corrected,
                                                   unsigned int* uncorrected, unsigned int* pending,
                                                   unsigned int* failure) {
  return Fake::Get().WithGpu("nvmlDeviceGetRemappedRows", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (corrected == nullptr || uncorrected == nullptr ||
                                   pending == nullptr || failure == nullptr) {
                                 return int32_t{RC_INVALID_ARGUMENT};
                               }
                               if (!g.remapped_rows_corrected.has_value())
                                 return int32_t{RC_NOT_SUPPORTED};
                               *corrected = AsUint(*g.remapped_rows_corrected);
                               *uncorrected = AsUint(g.remapped_rows_uncorrected.value_or(0));
                               *pending = AsUint(g.remapped_rows_pending.value_or(0)) != 0 ? 1 : 0;
                               *failure = AsUint(g.remapped_rows_failure.value_or(0)) != 0 ? 1 : 0;
                               return int32_t{RC_SUCCESS};
                             });
}

// nvmlEnableState_t: 1 enabled (up), 0 disabled (down).
FAKE_NVML_EXPORT int32_t nvmlDeviceGetNvLinkState(Gpu* device, unsigned int link,
                                                  uint32_t* active) {
  return Fake::Get().WithGpu("nvmlDeviceGetNvLinkState", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (active == nullptr) return int32_t{RC_INVALID_ARGUMENT};
                               if (g.nvlink_up.empty()) return int32_t{RC_NOT_SUPPORTED};
                               if (link >= g.nvlink_up.size()) return int32_t{RC_INVALID_ARGUMENT};
                               *active = g.nvlink_up[link] != 0 ? 1 : 0;
                               return int32_t{RC_SUCCESS};
                             });
}

FAKE_NVML_EXPORT int32_t nvmlDeviceGetNvLinkErrorCounter(Gpu* device, unsigned int link,
                                                         uint32_t counter, uint64_t* value) {
  return Fake::Get().WithGpu("nvmlDeviceGetNvLinkErrorCounter", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int) {
                               if (value == nullptr || counter >= kNvlinkErrorCounters) {
                                 return int32_t{RC_INVALID_ARGUMENT};
                               }
                               double v = 0;
                               const int32_t rc = LinkValue(g, g.nvlink_errors[counter], link, &v);
                               if (rc == RC_SUCCESS) *value = static_cast<uint64_t>(v);
                               return rc;
                             });
}

FAKE_NVML_EXPORT int32_t nvmlEventSetCreate(EventSetRec** set) {
  if (set == nullptr) return RC_INVALID_ARGUMENT;
  return Fake::Get().With("nvmlEventSetCreate", [&](const FakeState&) {
    *set = new EventSetRec();
    return int32_t{RC_SUCCESS};
  });
}

FAKE_NVML_EXPORT int32_t nvmlEventSetFree(EventSetRec* set) {
  if (set == nullptr) return RC_INVALID_ARGUMENT;
  return Fake::Get().With("nvmlEventSetFree", [&](const FakeState&) {
    delete set;
    return int32_t{RC_SUCCESS};
  });
}

// Only Xid events are supported; events that happened before the registration are not seen.
FAKE_NVML_EXPORT int32_t nvmlDeviceRegisterEvents(Gpu* device, uint64_t types, EventSetRec* set) {
  return Fake::Get().WithGpu("nvmlDeviceRegisterEvents", device,
                             [&](const FakeState&, const FakeGpu& g, unsigned int index) {
                               if (set == nullptr) return int32_t{RC_INVALID_ARGUMENT};
                               if (types == 0 || (types & ~kEventTypeXid) != 0) {
                                 return int32_t{RC_NOT_SUPPORTED};
                               }
                               if (set->delivered.count(index) == 0) {
                                 set->delivered[index] = g.xids.size();
                               }
                               return int32_t{RC_SUCCESS};
                             });
}

// The oldest Xid event not yet delivered by `set`, or TIMEOUT at once (the fake never waits; the
// longest timeout asked for is recorded).
FAKE_NVML_EXPORT int32_t nvmlEventSetWait_v2(EventSetRec* set, EventDataRec* data,
                                             unsigned int timeout_ms) {
  if (set == nullptr || data == nullptr) return RC_INVALID_ARGUMENT;
  return Fake::Get().With("nvmlEventSetWait_v2", [&](const FakeState& s) {
    Fake::Get().NoteEventWait(timeout_ms);
    for (auto& [index, delivered] : set->delivered) {
      if (index >= s.gpus.size()) continue;
      const std::vector<double>& xids = s.gpus[index].xids;
      delivered = std::min(delivered, xids.size());  // The state was rewritten shorter.
      if (delivered == xids.size()) continue;
      data->device = Fake::Get().Handle(index);
      data->event_type = kEventTypeXid;
      data->event_data = static_cast<uint64_t>(xids[delivered]);
      data->gpu_instance_id = data->compute_instance_id = 0xFFFFFFFFu;
      ++delivered;
      return int32_t{RC_SUCCESS};
    }
    return int32_t{RC_TIMEOUT};
  });
}

#endif  // FAKE_NVML_MINIMAL
