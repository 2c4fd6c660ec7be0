// The GPU health metrics of the GPU table (GpuSample.health): PCIe link, ECC, row remapping,
// NVLink state and errors, Xid events. Counters are the driver's (the agent adds nothing), so a
// rate or increase over them is the fault's pace.
#pragma once

#include <vector>

#include "metrics/node_metric_table.h"

namespace stepwatch::metrics {

// Appends the health metrics to the GPU table. The per-NVLink ones are agent-only: 18 links with
// 5 series each per GPU is node-local detail, not a fleet's /metrics.
void AppendGpuHealthMetrics(std::vector<GpuMetric>* table);

}  // namespace stepwatch::metrics
