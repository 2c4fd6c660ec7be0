// InfiniBand and RoCE port readings from sysfs (/sys/class/infiniband/<device>/ports/<port>/):
// link state, rate and width, error and traffic counters, and the driver's hw_counters. The
// parsers are pure functions over file contents; NicPortReader walks the tree under a root.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::host {

// Bounds of one reading, so that a host with many devices or a driver with many hw_counters
// cannot grow a host sample without limit (the collector refuses samples beyond them).
inline constexpr size_t kMaxNicPorts = 64;
inline constexpr size_t kMaxNicHwCounters = 64;
// "<device>:<port>" and each hw_counters name.
inline constexpr size_t kMaxNicNameBytes = 64;

// The number before the colon of `state` or `phys_state` ("4: ACTIVE" -> 4, "5: LinkUp" -> 5).
absl::StatusOr<uint32_t> ParseIbPortState(absl::string_view text);

struct IbRate {
  double bytes_per_second = 0;
  std::optional<uint32_t> link_width;  // lanes, from "(4X HDR)"; absent when not given
};
// `rate`: "200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)", "100 Gb/sec (2X HDR)".
absl::StatusOr<IbRate> ParseIbRate(absl::string_view text);

// One unsigned decimal counter file ("1234\n").
absl::StatusOr<uint64_t> ParseSysfsCounter(absl::string_view text);

// A device or hw_counters name the reader accepts: 1..kMaxNicNameBytes of [A-Za-z0-9_.-].
bool IsNicName(absl::string_view name);

// Reads every port under `root`/sys/class/infiniband. Not thread-safe (the host sampler calls it
// under its lock).
class NicPortReader {
 public:
  explicit NicPortReader(std::string root, size_t max_ports = kMaxNicPorts)
      : root_(std::move(root)), max_ports_(max_ports) {}

  // Adds a NicPort to `sample` for each port (devices in name order, ports in number order), at
  // most max_ports, and counts the rest in nic_ports_omitted. No InfiniBand class: no ports.
  void Read(v1::HostSample* sample);

  // Readings found unreadable or unparsable since the reader was made.
  uint64_t unavailable_readings_total() const { return unavailable_total_; }

 private:
  void ReadPort(const std::string& dir, v1::NicPort* port);
  void ReadHwCounters(const std::string& dir, v1::NicPort* port);
  // Records that `reading` of `port` could not be had; logs the first failure of each reading.
  void Unavailable(const std::string& reading, absl::string_view why, v1::NicPort* port);

  const std::string root_;
  const size_t max_ports_;
  uint64_t unavailable_total_ = 0;
  // Readings whose failure was logged; bounded by the fixed readings plus "hw_counters".
  std::set<std::string> logged_;
  size_t last_port_count_ = 0;
  bool read_before_ = false;
};

}  // namespace stepwatch::host
