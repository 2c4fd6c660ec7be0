#include "collector/convert.h"

#include <algorithm>
#include <string_view>

#include "analysis/health.h"
#include "analysis/health_tracker.h"
#include "collector/convert_health.h"
#include "collector/pod_index.h"
#include "common/text.h"

namespace stepwatch::collector {

analysis::StepEvent ToStepSample(const v1::StepEvent& e, const std::string& node,
                                 int64_t default_received_unix_nanos) {
  analysis::StepEvent s;
  FillStepSample(e, node, default_received_unix_nanos, &s);
  return s;
}

void FillStepSample(const v1::StepEvent& e, const std::string& node,
                    int64_t default_received_unix_nanos, analysis::StepEvent* out) {
  analysis::StepEvent& s = *out;
  s.job = e.job();
  s.rank = e.rank();
  s.world_size = e.world_size();
  s.step = e.step();
  s.step_seconds = e.step_seconds();
  s.data_seconds = e.has_data_seconds() ? std::optional<double>(e.data_seconds()) : std::nullopt;
  s.compute_seconds =
      e.has_compute_seconds() ? std::optional<double>(e.compute_seconds()) : std::nullopt;
  s.comm_seconds = e.has_comm_seconds() ? std::optional<double>(e.comm_seconds()) : std::nullopt;
  s.samples = e.has_samples() ? std::optional<int64_t>(e.samples()) : std::nullopt;
  s.local_rank = e.has_local_rank() ? std::optional<int>(e.local_rank()) : std::nullopt;
  s.gpu = e.has_gpu() ? std::optional<int>(e.gpu()) : std::nullopt;
  s.dp_rank = e.has_dp_rank() ? std::optional<int>(e.dp_rank()) : std::nullopt;
  s.pp_stage = e.has_pp_stage() ? std::optional<int>(e.pp_stage()) : std::nullopt;
  s.tp_rank = e.has_tp_rank() ? std::optional<int>(e.tp_rank()) : std::nullopt;
  // Sorted by name: a proto map's order is unspecified, the engine's input must be deterministic.
  // Reuses the strings of the previous event (the collector fills one sample per step).
  s.sections.resize(static_cast<size_t>(e.sections_size()));
  size_t i = 0;
  for (const auto& [name, seconds] : e.sections()) {
    s.sections[i].first.assign(name);
    s.sections[i].second = seconds;
    ++i;
  }
  std::sort(s.sections.begin(), s.sections.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  s.node = node;
  s.pid = e.pid();
  s.received_unix_nanos =
      e.received_unix_nanos() != 0 ? e.received_unix_nanos() : default_received_unix_nanos;
}

analysis::GpuSample ToGpuReading(const v1::GpuSample& g, const std::string& node) {
  analysis::GpuSample r;
  r.node = node;
  r.index = g.index();
  r.sampled_unix_nanos = g.sampled_unix_nanos();
  if (g.has_utilization_gpu_ratio()) r.utilization_ratio = g.utilization_gpu_ratio();
  if (g.has_sm_activity_ratio()) r.sm_activity_ratio = g.sm_activity_ratio();
  if (g.has_dram_bandwidth_ratio()) r.dram_bandwidth_ratio = g.dram_bandwidth_ratio();
  if (g.has_tensor_activity_ratio()) r.tensor_activity_ratio = g.tensor_activity_ratio();
  if (g.has_sm_clock_mhz()) r.sm_clock_mhz = g.sm_clock_mhz();
  if (g.has_sm_clock_max_mhz()) r.sm_clock_max_mhz = g.sm_clock_max_mhz();
  if (g.has_power_watts()) r.power_watts = g.power_watts();
  if (g.has_power_limit_watts()) r.power_limit_watts = g.power_limit_watts();
  if (g.has_temperature_celsius()) r.temperature_celsius = g.temperature_celsius();
  if (g.has_throttle_reasons()) r.throttle_reasons = g.throttle_reasons();
  r.pids.assign(g.pids().begin(), g.pids().end());
  if (g.has_health()) r.health = ToGpuHealth(g.health());
  return r;
}

analysis::HostSample ToHostReading(const v1::HostSample& h, const std::string& node) {
  analysis::HostSample r;
  r.node = node;
  r.sampled_unix_nanos = h.sampled_unix_nanos();
  r.cpu_count = h.cpu_count();
  if (h.has_cpu_utilization_ratio()) r.cpu_utilization_ratio = h.cpu_utilization_ratio();
  if (h.has_memory_bandwidth_bytes_per_second()) {
    r.memory_bandwidth_bytes_per_second = h.memory_bandwidth_bytes_per_second();
  }
  r.nic_ports = ToNicPorts(h);
  return r;
}

int64_t ExitedUnixNanos(const v1::RankExit& exit, int64_t default_unix_nanos) {
  return exit.exited_unix_nanos() > 0 ? exit.exited_unix_nanos() : default_unix_nanos;
}

namespace {

// A problem with `value` of `field` against `max_bytes` (and control characters), or nullopt.
std::optional<FieldProblem> CheckText(const char* field, absl::string_view value,
                                      size_t max_bytes) {
  if (value.size() > max_bytes) return FieldProblem{field, "too_long"};
  if (FindControlCharacter(value) != absl::string_view::npos) {
    return FieldProblem{field, "control_character"};
  }
  return std::nullopt;
}

// Per entry of a protobuf map of strings: its node and the pair beside the strings' heap.
constexpr int64_t kMapEntryBytes = 96;
// Per element of a repeated message or string field: its pointer and the allocator's overhead
// (the element's own size is added apart); a string element is a separately allocated std::string.
constexpr int64_t kRepeatedMessageBytes = 16;
constexpr int64_t kRepeatedStringBytes = 16 + static_cast<int64_t>(sizeof(std::string));

}  // namespace

std::optional<FieldProblem> CheckBatchIdentifiers(const v1::ReportBatch& b) {
  if (auto p = CheckText("agent_id", b.agent_id(), kMaxNodeNameBytes)) return p;
  if (auto p = CheckText("boot_id", b.boot_id(), kMaxBootIdBytes)) return p;
  return CheckText("node", b.node().node(), kMaxNodeNameBytes);
}

std::optional<FieldProblem> CheckNodeInfo(const v1::NodeInfo& n) {
  if (auto p = CheckText("hostname", n.hostname(), kMaxNodeNameBytes)) return p;
  if (auto p = CheckText("agent_version", n.agent_version(), kMaxVersionBytes)) return p;
  if (auto p = CheckText("driver_version", n.driver_version(), kMaxVersionBytes)) return p;
  // An error message may span lines only in a hostile batch: control characters are refused too.
  return CheckText("nvml_error", n.nvml_error(), kMaxNvmlErrorBytes);
}

std::optional<FieldProblem> CheckGpuSample(const v1::GpuSample& g) {
  if (auto p = CheckText("gpu_uuid", g.uuid(), kMaxGpuTextBytes)) return p;
  if (auto p = CheckText("gpu_name", g.name(), kMaxGpuTextBytes)) return p;
  if (g.pids_size() > kMaxGpuPids) return FieldProblem{"gpu_pids", "too_long"};
  if (g.health().nvlinks_size() > kMaxGpuNvlinks) {
    return FieldProblem{"gpu_health_nvlinks", "too_long"};
  }
  if (g.health().xids_size() > kMaxGpuXids) return FieldProblem{"gpu_health_xids", "too_long"};
  if (auto p = CheckKubernetesPod(g.kubernetes_pod(), "gpu_kubernetes_pod")) return p;
  if (g.unavailable_metrics_size() > kMaxUnavailableMetrics) {
    return FieldProblem{"gpu_unavailable_metrics", "too_long"};
  }
  for (const auto& [metric, why] : g.unavailable_metrics()) {
    if (auto p = CheckText("gpu_unavailable_metrics", metric, kMaxMetricTextBytes)) return p;
    if (auto p = CheckText("gpu_unavailable_metrics", why, kMaxMetricTextBytes)) return p;
  }
  return std::nullopt;
}

std::optional<FieldProblem> CheckHostSample(const v1::HostSample& h) {
  if (auto p = CheckText("host_memory_bandwidth_source", h.memory_bandwidth_source(),
                         kMaxHostTextBytes)) {
    return p;
  }
  if (h.nic_ports_size() > kMaxNicPorts) return FieldProblem{"host_nic_ports", "too_long"};
  for (const v1::NicPort& port : h.nic_ports()) {
    if (auto p = CheckText("nic_port_device", port.device(), kMaxNicTextBytes)) return p;
    if (auto p = CheckText("nic_port_link_layer", port.link_layer(), kMaxNicTextBytes)) return p;
    if (port.hw_counters_size() > kMaxNicHwCounters) {
      return FieldProblem{"nic_port_hw_counters", "too_long"};
    }
    for (const auto& [name, value] : port.hw_counters()) {
      if (auto p = CheckText("nic_port_hw_counters", name, kMaxNicTextBytes)) return p;
    }
    if (port.unavailable_size() > kMaxNicUnavailable) {
      return FieldProblem{"nic_port_unavailable", "too_long"};
    }
    for (const std::string& reading : port.unavailable()) {
      if (auto p = CheckText("nic_port_unavailable", reading, kMaxNicTextBytes)) return p;
    }
  }
  return std::nullopt;
}

int64_t KeptBytes(const v1::NodeInfo& n) {
  return StringHeapBytes(n.node()) + StringHeapBytes(n.hostname()) +
         StringHeapBytes(n.agent_version()) + StringHeapBytes(n.driver_version()) +
         StringHeapBytes(n.nvml_error());
}

int64_t KeptBytes(const v1::GpuSample& g) {
  int64_t bytes = StringHeapBytes(g.uuid()) + StringHeapBytes(g.name());
  bytes += KeptBytes(g.kubernetes_pod());
  // pids: the view's repeated field and the engine's reading.
  bytes += 2 * static_cast<int64_t>(sizeof(uint32_t)) * g.pids_size();
  for (const auto& [metric, why] : g.unavailable_metrics()) {
    bytes += kMapEntryBytes + StringHeapBytes(metric) + StringHeapBytes(why);
  }
  // The health message and its parts, each allocated apart; the lists are bounded above.
  if (g.has_health()) {
    const v1::GpuHealth& h = g.health();
    bytes += static_cast<int64_t>(sizeof(v1::GpuHealth));
    if (h.has_ecc()) bytes += static_cast<int64_t>(sizeof(v1::GpuHealth::Ecc));
    if (h.has_remapped_rows()) bytes += static_cast<int64_t>(sizeof(v1::GpuHealth::RemappedRows));
    bytes += h.nvlinks_size() *
             (kRepeatedMessageBytes + static_cast<int64_t>(sizeof(v1::GpuHealth::NvLink)));
    bytes +=
        h.xids_size() * (kRepeatedMessageBytes + static_cast<int64_t>(sizeof(v1::GpuHealth::Xid)));
    // The engine's copy (analysis::GpuHealth) and its tracker's entries per Xid code (three maps).
    bytes += h.nvlinks_size() * static_cast<int64_t>(sizeof(analysis::NvLinkHealth));
    bytes +=
        h.xids_size() * (static_cast<int64_t>(sizeof(analysis::XidCount)) + 3 * kMapEntryBytes);
  }
  return bytes;
}

int64_t KeptBytes(const v1::HostSample& h) {
  int64_t bytes = StringHeapBytes(h.memory_bandwidth_source());
  // The view keeps the ports as sent: each message, its strings and its map and list entries.
  for (const v1::NicPort& port : h.nic_ports()) {
    bytes += kRepeatedMessageBytes + static_cast<int64_t>(sizeof(v1::NicPort)) +
             StringHeapBytes(port.device()) + StringHeapBytes(port.link_layer());
    for (const auto& [name, value] : port.hw_counters()) {
      bytes += kMapEntryBytes + StringHeapBytes(name);
    }
    for (const std::string& reading : port.unavailable()) {
      bytes += kRepeatedStringBytes + StringHeapBytes(reading);
    }
    // The engine's copy (analysis::NicPortHealth) and its tracker's entry for the port (keyed by
    // the device name, two windows of counter checkpoints).
    bytes += static_cast<int64_t>(sizeof(analysis::NicPortHealth)) + kMapEntryBytes +
             2 * StringHeapBytes(port.device()) +
             2 * static_cast<int64_t>(sizeof(analysis::RiseWindow));
  }
  return bytes;
}

namespace {

// Copies each optional field that is set; the proto and C++ names are the same.
#define STEPWATCH_COPY_SET(from, to, field) \
  if ((from).field) (to)->set_##field(*(from).field)

void ToProto(const analysis::DeviceEvidence& d, v1::DeviceEvidence* out) {
  out->set_rank(d.rank);
  out->set_node(d.node);
  out->set_gpu(d.gpu);
  STEPWATCH_COPY_SET(d, out, sm_clock_mhz);
  STEPWATCH_COPY_SET(d, out, sm_clock_max_mhz);
  STEPWATCH_COPY_SET(d, out, throttle_reasons);
  STEPWATCH_COPY_SET(d, out, temperature_celsius);
  STEPWATCH_COPY_SET(d, out, power_watts);
  STEPWATCH_COPY_SET(d, out, power_limit_watts);
  STEPWATCH_COPY_SET(d, out, utilization_ratio);
  STEPWATCH_COPY_SET(d, out, sm_activity_ratio);
  STEPWATCH_COPY_SET(d, out, dram_bandwidth_ratio);
  STEPWATCH_COPY_SET(d, out, host_cpu_ratio);
  STEPWATCH_COPY_SET(d, out, host_cpu_median_ratio);
  for (const std::string& h : d.health) out->add_health(h);
}

void ToProto(const analysis::Evidence& e, v1::FindingEvidence* out) {
  STEPWATCH_COPY_SET(e, out, busy_vs_median_ratio);
  STEPWATCH_COPY_SET(e, out, compute_vs_median_ratio);
  STEPWATCH_COPY_SET(e, out, data_excess_seconds);
  STEPWATCH_COPY_SET(e, out, section);
  STEPWATCH_COPY_SET(e, out, section_vs_reference_ratio);
  STEPWATCH_COPY_SET(e, out, slow_rank_count);
  STEPWATCH_COPY_SET(e, out, node_rank_count);
  STEPWATCH_COPY_SET(e, out, stage_vs_median_ratio);
  STEPWATCH_COPY_SET(e, out, stage_busy_seconds);
  STEPWATCH_COPY_SET(e, out, other_stages_busy_seconds);
  for (const std::string& n : e.nodes) out->add_nodes(n);
  STEPWATCH_COPY_SET(e, out, node_count);
  STEPWATCH_COPY_SET(e, out, utilization_threshold_ratio);
  STEPWATCH_COPY_SET(e, out, below_threshold_seconds);
  STEPWATCH_COPY_SET(e, out, data_share_ratio);
  STEPWATCH_COPY_SET(e, out, comm_share_ratio);
  STEPWATCH_COPY_SET(e, out, imbalance_share_ratio);
  STEPWATCH_COPY_SET(e, out, scaling_efficiency_ratio);
  STEPWATCH_COPY_SET(e, out, world_size);
  STEPWATCH_COPY_SET(e, out, reference_world_size);
  STEPWATCH_COPY_SET(e, out, step_seconds);
  STEPWATCH_COPY_SET(e, out, baseline_step_seconds);
  STEPWATCH_COPY_SET(e, out, step_vs_baseline_ratio);
  STEPWATCH_COPY_SET(e, out, rise_seconds);
  STEPWATCH_COPY_SET(e, out, stall_limit_seconds);
  STEPWATCH_COPY_SET(e, out, median_step_seconds);
  STEPWATCH_COPY_SET(e, out, silent_rank_count);
  STEPWATCH_COPY_SET(e, out, waiting_rank_count);
  STEPWATCH_COPY_SET(e, out, exited_rank_count);
  for (int r : e.waiting_ranks) out->add_waiting_ranks(r);
  for (int r : e.exited_ranks) out->add_exited_ranks(r);
  for (const analysis::DeviceEvidence& d : e.devices) ToProto(d, out->add_devices());
  for (const std::string& h : e.health) out->add_health(h);
  for (const std::string& j : e.jobs_at_risk) out->add_jobs_at_risk(j);
}

#undef STEPWATCH_COPY_SET

}  // namespace

void WhatIfToProto(const analysis::WhatIf& w, google::protobuf::Map<std::string, double>* speedup,
                   google::protobuf::Map<std::string, std::string>* kind) {
  const struct {
    const char* fix;
    double speedup;
    analysis::WhatIfKind kind;
  } fixes[] = {{"stragglers", w.stragglers, w.stragglers_kind},
               {"overlap", w.overlap, w.overlap_kind},
               {"data", w.data, w.data_kind},
               {"pipeline", w.pipeline, w.pipeline_kind}};
  for (const auto& f : fixes) {
    // Balancing pipeline stages means nothing to a job without stages.
    if (f.fix == std::string_view("pipeline") && !(f.speedup > 1)) continue;
    (*speedup)[f.fix] = f.speedup;
    (*kind)[f.fix] = analysis::WhatIfKindName(f.kind);
  }
}

void ToProto(const analysis::Finding& f, v1::Finding* out) {
  out->set_kind(analysis::FindingKindName(f.kind));
  out->set_job(f.job);
  out->set_rank(f.rank);
  out->set_node(f.node);
  out->set_gpu(f.gpu);
  out->set_device(f.device);
  out->set_since_step(f.since_step);
  out->set_severity(analysis::SeverityName(f.severity));
  out->set_summary(f.summary);
  out->set_since_unix_nanos(f.since_unix_nanos);
  out->set_persistent(f.persistent);
  out->set_cause(analysis::CauseName(f.cause));
  for (analysis::Cause c : f.causes) out->add_causes(analysis::CauseName(c));
  out->set_action(f.action);
  out->set_stage(f.stage);
  for (int r : f.ranks) out->add_ranks(r);
  out->set_until_step(-1);
  ToProto(f.evidence, out->mutable_evidence());
}

void ToProto(const analysis::JobSnapshot& j, int finding_count, v1::JobStatus* out) {
  out->set_job(j.job);
  out->set_world_size(j.world_size);
  out->set_ranks_reporting(j.ranks_reporting);
  out->set_last_step(j.last_step);
  out->set_step_seconds(j.median_step_seconds);
  out->set_steps_per_second(j.steps_per_second);
  out->set_samples_per_second(j.samples_per_second);
  out->set_efficiency_ratio(j.efficiency_ratio);
  out->set_finding_count(finding_count);
  out->set_last_seen_unix_nanos(j.last_seen_unix_nanos);
  for (const std::string& name : j.section_names) out->add_section_names(name);
  out->set_sections_folded(j.sections_folded);
  out->set_last_complete_step(j.last_complete_step);
  out->set_incomplete_steps(j.incomplete_steps);
  out->set_late_samples(j.late_samples);
}

void ToProto(const analysis::RankSnapshot& r, v1::RankRow* out) {
  out->set_rank(r.rank);
  out->set_node(r.node);
  out->set_gpu(r.gpu);
  out->set_busy_seconds(r.busy_seconds);
  out->set_compute_seconds(r.compute_seconds);
  out->set_data_seconds(r.data_seconds);
  out->set_comm_seconds(r.comm_seconds);
  out->set_busy_vs_median_ratio(r.busy_vs_median_ratio);
  out->set_straggler(r.straggler);
  out->set_pp_stage(r.pp_stage);
  out->set_comparable(r.comparable);
  for (const analysis::SectionMedian& s : r.sections) {
    v1::SectionMedian* m = out->add_sections();
    m->set_name(s.name);
    m->set_seconds(s.seconds);
  }
}

}  // namespace stepwatch::collector
