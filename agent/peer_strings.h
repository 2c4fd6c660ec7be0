// Bounds on the strings the agent ships but does not choose: what NVML says about the GPUs (name,
// UUID, driver version, error texts) and what the host says about itself (its name). They become
// label values and log lines at the collector, so a driver shim or a hostile host cannot send a
// megabyte, an escape sequence or invalid UTF-8 through the agent. The step-event datagram's own
// strings (job, section names) are refused by common/step_event_rules.h before they get here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

// The strings bounded, by where they come from. The names (PeerStringFieldName) are metric label
// values: never rename.
enum class PeerStringField {
  kGpuName = 0,
  kGpuUuid,
  kDriverVersion,
  kNvmlError,          // NodeInfo.nvml_error
  kUnavailableMetric,  // GpuSample.unavailable_metrics values (and keys)
  kHostname,
};
inline constexpr int kPeerStringFieldCount = 6;

const char* PeerStringFieldName(PeerStringField field);
// The most bytes kept of a string of `field`.
size_t PeerStringLimit(PeerStringField field);

// Times a string of each field was cut to its limit or had bytes replaced.
using PeerStringCounts = std::array<uint64_t, kPeerStringFieldCount>;

// Keeps at most `max_bytes` of `*s`, cut at a character boundary; replaces every byte that is not
// part of printable UTF-8 (control characters, DEL, C1 controls, invalid sequences) with '?'.
// Returns whether `*s` changed.
bool BoundPeerString(std::string* s, size_t max_bytes);

// Applies the bounds to every peer-chosen string of `node` and `gpus`; counts what changed.
void BoundPeerStrings(v1::NodeInfo* node, std::vector<v1::GpuSample>* gpus,
                      PeerStringCounts* counts);

}  // namespace stepwatch::agent
