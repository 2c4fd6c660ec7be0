// GPU hardware health through NVML: PCIe link generation, width and replays, ECC counts, row
// remapping, NVLink state and error counters, and Xid events. Read by GpuSource for each GPU on
// the library it already loaded; kept apart so that the loader stays about the usage readings.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpu/nvml_abi.h"
#include "gpu/unavailable_readings.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::gpu {

// Names of the health readings whose availability GpuSample.unavailable_metrics reports.
inline constexpr const char* kGpuHealthReadingNames[] = {
    "pcie_link", "pcie_replays", "ecc", "remapped_rows", "nvlink_state", "nvlink_errors", "xid",
};

// Xid codes kept per GPU (GpuHealth.xids); events of further codes are only counted.
inline constexpr int kMaxXidCodesPerGpu = 16;
// Xid events taken from NVML's queue per GPU reading at most, so that an event storm cannot hold
// the sampler; the rest wait for the next reading.
inline constexpr int kMaxXidEventsPerRead = 256;

// Not thread-safe: the GpuSource calls it under its own lock, as every NVML call.
class GpuHealthReader {
 public:
  // Resolves the health entry points of `nvml_handle` (a dlopen handle of an initialised NVML).
  GpuHealthReader(void* nvml_handle, nvml::ErrorStringFn error_string);
  // Frees the event set: destroy the reader before nvmlShutdown.
  ~GpuHealthReader();
  GpuHealthReader(const GpuHealthReader&) = delete;
  GpuHealthReader& operator=(const GpuHealthReader&) = delete;

  // Reads the health of GPU `index` into sample->health() (left unset when nothing could be
  // read); each reading the driver does not give is recorded in `unavailable`. Never blocks:
  // pending Xid events are taken with a zero timeout.
  void Read(unsigned int index, nvml::Device device, int64_t now_unix_nanos,
            UnavailableReadings* unavailable, v1::GpuSample* sample);

 private:
  struct Api {
    nvml::DeviceGetUintFn curr_pcie_link_generation = nullptr;
    nvml::DeviceGetUintFn max_pcie_link_generation = nullptr;
    nvml::DeviceGetUintFn gpu_max_pcie_link_generation = nullptr;
    nvml::DeviceGetUintFn curr_pcie_link_width = nullptr;
    nvml::DeviceGetUintFn max_pcie_link_width = nullptr;
    nvml::DeviceGetUintFn pcie_replay_counter = nullptr;
    nvml::DeviceGetTotalEccErrorsFn total_ecc_errors = nullptr;
    nvml::DeviceGetRemappedRowsFn remapped_rows = nullptr;
    nvml::DeviceGetNvLinkStateFn nvlink_state = nullptr;
    nvml::DeviceGetNvLinkErrorCounterFn nvlink_error_counter = nullptr;
    nvml::EventSetCreateFn event_set_create = nullptr;
    nvml::EventSetFreeFn event_set_free = nullptr;
    nvml::DeviceRegisterEventsFn register_events = nullptr;
    nvml::EventSetWaitFn event_set_wait = nullptr;
  };

  struct XidCount {
    uint64_t count = 0;
    int64_t last_unix_nanos = 0;
  };

  struct DeviceHealth {
    // The links found by the first complete probe of links 0..17; unset before it.
    std::optional<std::vector<unsigned int>> nvlinks;
    bool xid_registered = false;
    // Why Xid events cannot be read on this GPU (an UnavailableReason), and what said so.
    std::string xid_reason;
    std::string xid_detail;
    std::map<uint32_t, XidCount> xids;
    uint64_t xid_events_dropped = 0;
  };

  // The first failed call of one reading.
  struct Failure {
    nvml::Return rc = nvml::kSuccess;
    std::string detail;
  };

  // Calls fn(args...) when exported; false (and the first failure noted) otherwise.
  template <typename Fn, typename... Args>
  bool Call(Fn fn, const char* name, Failure* failure, Args... args) const;
  static void Report(unsigned int index, const char* reading, const Failure& failure,
                     UnavailableReadings* unavailable, v1::GpuSample* sample);

  void ReadPcie(unsigned int index, nvml::Device device, UnavailableReadings* unavailable,
                v1::GpuSample* sample, v1::GpuHealth* health) const;
  void ReadMemory(unsigned int index, nvml::Device device, UnavailableReadings* unavailable,
                  v1::GpuSample* sample, v1::GpuHealth* health) const;
  void ReadNvlinks(unsigned int index, nvml::Device device, DeviceHealth* state,
                   UnavailableReadings* unavailable, v1::GpuSample* sample,
                   v1::GpuHealth* health) const;
  void ReadXids(unsigned int index, nvml::Device device, int64_t now_unix_nanos,
                DeviceHealth* state, UnavailableReadings* unavailable, v1::GpuSample* sample,
                v1::GpuHealth* health);
  // Takes the pending Xid events of every registered GPU; false (with `failure`) when the wait
  // failed.
  bool DrainEvents(int64_t now_unix_nanos, Failure* failure);
  std::string ErrorString(nvml::Return rc) const;

  Api api_;
  nvml::ErrorStringFn error_string_ = nullptr;
  bool event_set_tried_ = false;
  nvml::EventSet event_set_ = nullptr;
  // Why no event set exists, when it does not.
  Failure event_set_failure_;
  std::vector<DeviceHealth> devices_;
  // Handles registered in the event set, and their GPU index.
  std::vector<std::pair<nvml::Device, unsigned int>> registered_;
};

}  // namespace stepwatch::gpu
