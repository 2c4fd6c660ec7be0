// Host readings for the agent from /proc (resctrl or perf for memory bandwidth, sysfs for
// InfiniBand/RoCE ports), with an injectable filesystem root so that parsers are tested on a fake
// tree.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::host {

struct HostSamplerOptions {
  // Prefix for /proc and /sys paths ("" means the real root).
  std::string root;
};

class HostSampler {
 public:
  virtual ~HostSampler() = default;
  // CPU utilization is computed against the previous call, so the first sample has none.
  virtual absl::StatusOr<v1::HostSample> Sample(int64_t now_unix_nanos) = 0;
};

std::unique_ptr<HostSampler> MakeHostSampler(const HostSamplerOptions& options);

}  // namespace stepwatch::host
