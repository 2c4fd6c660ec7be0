// The InfiniBand/RoCE port metrics of the host table (HostSample.nic_ports): one series per port,
// labelled device="<device>:<port>", in base units (rates in bytes per second, data in bytes).
#pragma once

#include <vector>

#include "metrics/node_metric_table.h"

namespace stepwatch::metrics {

// Appends the NIC metrics ("nic_" names) to the host table.
void AppendNicMetrics(std::vector<HostMetric>* table);

// IB logical port states ACTIVE and ACTIVE_DEFER, and physical state LinkUp (the `state` and
// `phys_state` numbers).
inline constexpr uint32_t kIbPortStateActive = 4;
inline constexpr uint32_t kIbPortStateActiveDefer = 5;
inline constexpr uint32_t kIbPhysicalStateLinkUp = 5;

}  // namespace stepwatch::metrics
