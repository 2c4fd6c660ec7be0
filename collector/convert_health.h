// Conversion of the health readings (a GPU's GpuHealth, a host's NIC ports) from the wire messages
// to the analysis library's structs (analysis/health.h). Bounds are checked before (convert.h).
#pragma once

#include <vector>

#include "analysis/health.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

analysis::GpuHealth ToGpuHealth(const v1::GpuHealth& health);
std::vector<analysis::NicPortHealth> ToNicPorts(const v1::HostSample& host);

}  // namespace stepwatch::collector
