// What the agent knows about its node at one cut: the NodeInfo with the GPUs described, a GPU and
// a host sample, and what failed on the way. The router reads it once per interval (ReadNode) and
// keeps the latest one for the agent's own /metrics. Also the agent's identity: a stable agent_id
// and a per-process boot_id.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/peer_strings.h"
#include "gpu/gpu_source.h"
#include "host/host_sampler.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

// One reading of the node: its NodeInfo with the GPUs described and, when samples were taken, a
// GPU and a host sample; a source that fails leaves its part out and is counted.
struct NodeReading {
  v1::NodeInfo node;
  std::vector<v1::GpuSample> gpus;
  std::optional<v1::HostSample> host;
  uint64_t gpu_errors = 0;
  uint64_t host_errors = 0;
  // Strings of `node` and `gpus` that BoundPeerStrings changed.
  PeerStringCounts strings_bounded{};
};

// Reads the node for a cut. `gpus` and `host` may be nullptr (nothing of that kind is read);
// without `with_samples` only the NodeInfo is filled in. The peer-chosen strings are bounded
// (BoundPeerStrings).
NodeReading ReadNode(const v1::NodeInfo& info, gpu::GpuSource* gpus, host::HostSampler* host,
                     int64_t now_unix_nanos, bool with_samples);

// "<node>-<16 hex digits of a hash of the socket path>": stable across restarts, distinct for
// several agents on one machine.
std::string MakeAgentId(const std::string& node, const std::string& socket_path);
// 32 random hex digits.
std::string MakeBootId();

}  // namespace stepwatch::agent
