// Hardware health as the agents read it: a GPU's PCIe link, ECC counters, row remapping, NVLinks
// and Xid events (NVML), and a node's InfiniBand / RoCE ports (sysfs). Counters are the driver's
// totals, which say nothing by themselves (a count present since the agent started is history):
// the health detectors (analysis/detectors/gpu_health.h, nic_health.h) judge their rise.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stepwatch::analysis {

struct NvLinkHealth {
  int link = 0;
  bool up = true;
  // Replay, recovery, CRC flit and CRC data errors summed (absent when the driver gives none).
  std::optional<uint64_t> errors_total;
  std::optional<uint64_t> recovery_errors_total;
};

struct XidCount {
  uint32_t xid = 0;
  uint64_t count = 0;  // events since the agent started
  int64_t last_unix_nanos = 0;
};

struct GpuHealth {
  std::optional<uint32_t> pcie_generation, pcie_generation_max;
  std::optional<uint32_t> pcie_width, pcie_width_max;
  std::optional<uint64_t> pcie_replays_total;
  // Volatile (since the driver loaded) uncorrected ECC errors.
  std::optional<uint64_t> ecc_uncorrected_total;
  std::optional<bool> row_remap_pending;
  std::optional<bool> row_remap_failure;
  std::vector<NvLinkHealth> nvlinks;
  std::vector<XidCount> xids;
};

struct NicPortHealth {
  std::string device;                      // "<device>:<port>", e.g. "mlx5_0:1"
  std::optional<uint32_t> state;           // 4 ACTIVE
  std::optional<uint32_t> physical_state;  // 5 LinkUp
  std::optional<double> rate_bytes_per_second;
  std::optional<uint32_t> link_width;
  // symbol_error + port_rcv_errors (link quality), and link_downed.
  std::optional<uint64_t> errors_total;
  std::optional<uint64_t> link_downed_total;

  bool Active() const { return state == 4u || state == 5u; }
  bool Known() const { return state.has_value() || physical_state.has_value(); }
  bool Up() const { return Active() && physical_state.value_or(5) == 5; }
};

// What an Xid code means, in a few words, and whether it is a fault of the GPU (or its driver,
// bus or memory) rather than of the application that ran on it.
struct XidClass {
  const char* meaning;
  bool hardware;
  bool critical;  // the GPU needs a reset or replacing, or fell off the bus
};
XidClass ClassifyXid(uint32_t xid);

}  // namespace stepwatch::analysis
