// Conversion between the stepwatch.v1 wire messages and the analysis library's plain structs. The
// analysis library knows nothing of protobuf; this is the only place that knows both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "analysis/engine.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

// `node` is the node of the agent that received the event; `default_received_unix_nanos` is used
// when the agent did not stamp the event.
analysis::StepEvent ToStepSample(const v1::StepEvent& event, const std::string& node,
                                 int64_t default_received_unix_nanos);
// The same, overwriting every field of `*out` (reusing its string capacity).
void FillStepSample(const v1::StepEvent& event, const std::string& node,
                    int64_t default_received_unix_nanos, analysis::StepEvent* out);
analysis::GpuSample ToGpuReading(const v1::GpuSample& sample, const std::string& node);
analysis::HostSample ToHostReading(const v1::HostSample& sample, const std::string& node);
// When a rank's process exited: the agent's stamp, or `default_unix_nanos` when it sent none.
int64_t ExitedUnixNanos(const v1::RankExit& exit, int64_t default_unix_nanos);

// The job's what-ifs (fix -> speed-up) and what each is (fix -> "estimate", "lower_bound" or
// "upper_bound"); "pipeline" only for a job whose stages it would balance.
void WhatIfToProto(const analysis::WhatIf& whatif,
                   google::protobuf::Map<std::string, double>* speedup,
                   google::protobuf::Map<std::string, std::string>* kind);

// Bounds on the strings (and lists) of a ReportBatch that the collector keeps: a peer chooses
// them, and what is kept must be bounded and charged (docs/security.md, "Identity and admission").
// An identifier out of bounds (agent_id, boot_id, node) refuses its batch: it cannot say who sent
// it. Any other field out of bounds refuses the item that holds it (the batch's NodeInfo, a GPU
// sample, the host sample); the rest of the batch is applied. Steps are bounded by the step-event
// rules (job 1-256 bytes, at most 16 section names of 1-64 bytes), rank exits and released jobs
// are only looked up, never kept. A genuine agent stays well inside every bound.
inline constexpr size_t kMaxNodeNameBytes = 256;  // node, agent_id, hostname
inline constexpr size_t kMaxBootIdBytes = 128;
inline constexpr size_t kMaxVersionBytes = 128;     // agent_version, driver_version
inline constexpr size_t kMaxNvmlErrorBytes = 4096;  // the error names the NVML library's path
inline constexpr size_t kMaxGpuTextBytes = 128;     // a GPU's uuid and name
inline constexpr int kMaxGpuPids = 1024;            // processes with a context on one GPU
inline constexpr int kMaxUnavailableMetrics = 32;   // GpuSample.unavailable_metrics entries
inline constexpr int kMaxGpuNvlinks = 18;           // GpuHealth.nvlinks (NVML_NVLINK_MAX_LINKS)
inline constexpr int kMaxGpuXids = 16;              // GpuHealth.xids (gpu::kMaxXidCodesPerGpu)
inline constexpr size_t kMaxMetricTextBytes = 64;   // their keys and values
inline constexpr size_t kMaxHostTextBytes = 32;     // HostSample.memory_bandwidth_source
inline constexpr int kMaxNicPorts = 64;             // HostSample.nic_ports
inline constexpr int kMaxNicHwCounters = 64;        // one port's hw_counters
inline constexpr int kMaxNicUnavailable = 16;       // one port's unavailable readings
inline constexpr size_t kMaxNicTextBytes = 64;      // device, link_layer and those names

// A field out of bounds: which (as the fields_refused counter names it, e.g. "boot_id",
// "gpu_name") and why ("too_long": over its bound, list too long included; "control_character").
struct FieldProblem {
  const char* field = "";
  const char* reason = "";
};
// Every field name and reason FieldProblem may carry, for /metrics.
inline constexpr const char* kCheckedFields[] = {"agent_id",
                                                 "boot_id",
                                                 "node",
                                                 "hostname",
                                                 "agent_version",
                                                 "driver_version",
                                                 "nvml_error",
                                                 "gpu_uuid",
                                                 "gpu_name",
                                                 "gpu_pids",
                                                 "gpu_unavailable_metrics",
                                                 "gpu_health_nvlinks",
                                                 "gpu_health_xids",
                                                 "host_memory_bandwidth_source",
                                                 "host_nic_ports",
                                                 "nic_port_device",
                                                 "nic_port_link_layer",
                                                 "nic_port_hw_counters",
                                                 "nic_port_unavailable",
                                                 "gpu_kubernetes_pod",
                                                 "step_kubernetes_pod"};
inline constexpr const char* kFieldProblemReasons[] = {"too_long", "control_character"};

// The batch's identifiers: agent_id, boot_id and node (nullopt when all are within bounds).
std::optional<FieldProblem> CheckBatchIdentifiers(const v1::ReportBatch& batch);
// The descriptive fields of a NodeInfo (hostname, agent_version, driver_version, nvml_error).
std::optional<FieldProblem> CheckNodeInfo(const v1::NodeInfo& info);
std::optional<FieldProblem> CheckGpuSample(const v1::GpuSample& sample);
std::optional<FieldProblem> CheckHostSample(const v1::HostSample& sample);

// Heap bytes a kept copy of `s` takes beyond the std::string itself (short strings live inside
// it; the measured MemoryCosts include those).
inline int64_t StringHeapBytes(absl::string_view s) {
  return s.size() > 15 ? static_cast<int64_t>(s.size()) + 1 : 0;
}
// What the collector keeps of each message beyond its measured fixed cost (MemoryCosts): its
// strings and lists, as many times as it keeps them (a GPU's pids twice: its view and the
// engine's reading).
int64_t KeptBytes(const v1::NodeInfo& info);
int64_t KeptBytes(const v1::GpuSample& sample);
int64_t KeptBytes(const v1::HostSample& sample);

void ToProto(const analysis::Finding& finding, v1::Finding* out);
void ToProto(const analysis::JobSnapshot& job, int finding_count, v1::JobStatus* out);
void ToProto(const analysis::RankSnapshot& rank, v1::RankRow* out);

}  // namespace stepwatch::collector
