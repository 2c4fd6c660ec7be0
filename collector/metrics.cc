#include "collector/metrics.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stepwatch::collector {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// Collects families in a fixed order; families that end up without samples are left out.
class Builder {
 public:
  MetricFamily* Family(const std::string& name, const std::string& help, MetricType type) {
    auto it = index_.find(name);
    if (it != index_.end()) return &families_[it->second];
    index_.emplace(name, families_.size());
    families_.push_back(MetricFamily{name, help, type, {}});
    return &families_.back();
  }
  void Gauge(const std::string& name, const std::string& help, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    Family(name, help, MetricType::Gauge)->metric.push_back(std::move(m));
  }
  void Counter(const std::string& name, const std::string& help, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = value;
    Family(name, help, MetricType::Counter)->metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() {
    std::vector<MetricFamily> out;
    for (MetricFamily& f : families_) {
      if (!f.metric.empty()) out.push_back(std::move(f));
    }
    return out;
  }

 private:
  std::vector<MetricFamily> families_;
  std::map<std::string, size_t> index_;
};

std::string RankLabel(int rank) { return rank < 0 ? "" : absl::StrCat(rank); }

void AddJobs(const StateSnapshot& s, Builder* b) {
  for (const analysis::JobSnapshot& j : s.jobs) {
    const Labels job{{"job", j.job}};
    b->Gauge("stepwatch_job_step_seconds", "Recent median step time of the job.", job,
             j.median_step_s);
    b->Gauge("stepwatch_job_steps_per_second", "Steps per second (1 / median step time).", job,
             j.steps_per_second);
    b->Gauge("stepwatch_job_samples_per_second",
             "Samples per second over all ranks; 0 when ranks report no samples.", job,
             j.samples_per_second);
    b->Gauge("stepwatch_job_world_size", "Number of ranks in the job.", job, j.world_size);
    b->Gauge("stepwatch_job_ranks_reporting", "Ranks that reported recently.", job,
             j.ranks_reporting);
    b->Gauge("stepwatch_job_last_step", "Highest step number reported.", job,
             static_cast<double>(j.last_step));
    b->Gauge("stepwatch_job_last_seen_timestamp_seconds",
             "When the job last reported a step, Unix seconds.", job, j.last_seen_unix_nanos / 1e9);
    b->Gauge("stepwatch_job_split_known",
             "1 when ranks report how their step splits (or SM activity stands in for it); 0: "
             "efficiency, time shares and what-ifs are unknown and left out.",
             job, j.split_known ? 1 : 0);
    if (j.scaling_efficiency_ratio.has_value()) {
      b->Gauge("stepwatch_job_scaling_efficiency_ratio",
               "Per-GPU throughput vs the best per-GPU throughput at a smaller world size.", job,
               *j.scaling_efficiency_ratio);
    }
    // Without the split, these would read as 100% compute: absent means unknown.
    if (!j.split_known) continue;
    b->Gauge("stepwatch_job_efficiency_ratio",
             "Ideal step time (median busy time) / actual step time; absent when unknown.", job,
             j.efficiency_ratio);
    const std::pair<const char*, double> components[] = {{"compute", j.breakdown.compute},
                                                         {"imbalance", j.breakdown.imbalance},
                                                         {"comm", j.breakdown.comm},
                                                         {"data", j.breakdown.data},
                                                         {"other", j.breakdown.other}};
    for (const auto& [component, value] : components) {
      b->Gauge("stepwatch_job_time_ratio",
               "Share of the step time by component: compute, imbalance, comm, data, other.",
               {{"component", component}, {"job", j.job}}, value);
    }
    const std::pair<const char*, double> fixes[] = {{"stragglers", j.whatif.stragglers},
                                                    {"overlap", j.whatif.overlap},
                                                    {"data", j.whatif.data}};
    for (const auto& [fix, value] : fixes) {
      b->Gauge("stepwatch_job_whatif_speedup_ratio",
               "Estimated speed-up if the cause were fixed: stragglers, overlap, data.",
               {{"fix", fix}, {"job", j.job}}, value);
    }
  }
}

void AddRanks(const StateSnapshot& s, Builder* b) {
  for (const auto& [job, r] : s.top_ranks) {
    const Labels labels{{"job", job}, {"node", r.node}, {"rank", RankLabel(r.rank)}};
    if (r.straggler) {
      b->Gauge("stepwatch_straggler",
               "1 while the rank is flagged: alone, in a slow node or in the slowest stage of an "
               "imbalanced pipeline.",
               labels, 1);
    }
    b->Gauge("stepwatch_rank_busy_vs_median_ratio",
             "Busy time (data + compute) relative to the rank's peers' median, for every flagged "
             "rank and each job's slowest ranks.",
             labels, r.busy_vs_median_ratio);
    b->Gauge("stepwatch_rank_busy_seconds",
             "Median busy time (data + compute), for every flagged rank and each job's slowest "
             "ranks.",
             labels, r.busy_s);
  }
}

void AddFindings(const StateSnapshot& s, const MetricsOptions& o, Builder* b) {
  std::map<std::tuple<std::string, std::string, std::string>, int> counts;
  int finding_series = 0;
  for (const analysis::Finding& f : s.findings) {
    const std::string kind = analysis::FindingKindName(f.kind);
    const std::string severity = analysis::SeverityName(f.severity);
    ++counts[{f.job, kind, severity}];
    if (f.kind == analysis::FindingKind::kUnderutilizedGpu) {
      b->Gauge("stepwatch_gpu_underutilized", "1 while the GPU is flagged underutilized.",
               {{"gpu", RankLabel(f.gpu)}, {"job", f.job}, {"node", f.node}}, 1);
    }
    if (finding_series < o.max_finding_series) {
      ++finding_series;
      b->Gauge("stepwatch_finding",
               "1 per active finding (bounded in number); cause is the primary cause, stage the "
               "pipeline stage (empty when none).",
               {{"cause", analysis::CauseName(f.cause)},
                {"gpu", RankLabel(f.gpu)},
                {"job", f.job},
                {"kind", kind},
                {"node", f.node},
                {"rank", RankLabel(f.rank)},
                {"severity", severity},
                {"stage", RankLabel(f.stage)}},
               1);
    }
  }
  for (const auto& [key, n] : counts) {
    const auto& [job, kind, severity] = key;
    b->Gauge("stepwatch_findings", "Active findings by job, kind and severity.",
             {{"job", job}, {"kind", kind}, {"severity", severity}}, n);
  }
}

void AddNodes(const StateSnapshot& s, Builder* b) {
  for (const NodeView& n : s.nodes) {
    const Labels node{{"node", n.node}};
    const bool up = s.now_unix_nanos - n.last_seen_unix_nanos <= s.node_down_nanos;
    b->Gauge("stepwatch_node_up", "1 while the node's agent reports, 0 when it went quiet.", node,
             up ? 1 : 0);
    b->Gauge("stepwatch_node_last_seen_timestamp_seconds",
             "When the node's agent last reported, Unix seconds.", node,
             n.last_seen_unix_nanos / 1e9);
    b->Gauge("stepwatch_node_nvml_available", "1 when the node's agent could load NVML.", node,
             n.info.nvml_available() ? 1 : 0);
    for (const v1::GpuSample& g : n.gpus) {
      const Labels gl{{"gpu", absl::StrCat(g.index())}, {"node", n.node}};
      auto opt = [&](bool has, const char* name, const char* help, double v) {
        if (has) b->Gauge(name, help, gl, v);
      };
      opt(g.has_utilization_gpu_ratio(), "stepwatch_gpu_utilization_ratio",
          "Fraction of time a kernel was running (NVML utilization.gpu).",
          g.utilization_gpu_ratio());
      opt(g.has_utilization_memory_ratio(), "stepwatch_gpu_memory_utilization_ratio",
          "Fraction of time device memory was read or written.", g.utilization_memory_ratio());
      opt(g.has_sm_activity_ratio(), "stepwatch_gpu_sm_activity_ratio", "SM activity (GPM), 0..1.",
          g.sm_activity_ratio());
      opt(g.has_dram_bandwidth_ratio(), "stepwatch_gpu_dram_bandwidth_ratio",
          "DRAM bandwidth utilization (GPM), 0..1.", g.dram_bandwidth_ratio());
      opt(g.has_tensor_activity_ratio(), "stepwatch_gpu_tensor_activity_ratio",
          "Tensor core activity (GPM), 0..1.", g.tensor_activity_ratio());
      opt(g.has_sm_clock_mhz(), "stepwatch_gpu_sm_clock_hertz", "SM clock.",
          g.sm_clock_mhz() * 1e6);
      opt(g.has_sm_clock_max_mhz(), "stepwatch_gpu_sm_clock_max_hertz", "Maximum SM clock.",
          g.sm_clock_max_mhz() * 1e6);
      opt(g.has_memory_used_bytes(), "stepwatch_gpu_memory_used_bytes", "Device memory used.",
          static_cast<double>(g.memory_used_bytes()));
      opt(g.has_memory_total_bytes(), "stepwatch_gpu_memory_total_bytes", "Device memory total.",
          static_cast<double>(g.memory_total_bytes()));
      opt(g.has_power_watts(), "stepwatch_gpu_power_watts", "Power draw.", g.power_watts());
      opt(g.has_power_limit_watts(), "stepwatch_gpu_power_limit_watts", "Power limit.",
          g.power_limit_watts());
      opt(g.has_temperature_celsius(), "stepwatch_gpu_temperature_celsius", "GPU temperature.",
          g.temperature_celsius());
      opt(g.has_throttle_reasons(), "stepwatch_gpu_throttle_reasons",
          "NVML clocks-throttle-reasons bitmask (0: not throttled).",
          static_cast<double>(g.throttle_reasons()));
      opt(g.has_pcie_tx_bytes_per_second(), "stepwatch_gpu_pcie_transmit_bytes_per_second",
          "PCIe transmit throughput.", g.pcie_tx_bytes_per_second());
      opt(g.has_pcie_rx_bytes_per_second(), "stepwatch_gpu_pcie_receive_bytes_per_second",
          "PCIe receive throughput.", g.pcie_rx_bytes_per_second());
      opt(g.has_nvlink_tx_bytes_per_second(), "stepwatch_gpu_nvlink_transmit_bytes_per_second",
          "NVLink transmit throughput.", g.nvlink_tx_bytes_per_second());
      opt(g.has_nvlink_rx_bytes_per_second(), "stepwatch_gpu_nvlink_receive_bytes_per_second",
          "NVLink receive throughput.", g.nvlink_rx_bytes_per_second());
      b->Gauge("stepwatch_gpu_processes", "Processes with a compute context on the GPU.", gl,
               g.pids_size());
    }
    if (n.host.has_value()) {
      const v1::HostSample& h = *n.host;
      if (h.has_cpu_utilization_ratio()) {
        b->Gauge("stepwatch_host_cpu_utilization_ratio", "Busy fraction of all CPUs.", node,
                 h.cpu_utilization_ratio());
      }
      b->Gauge("stepwatch_host_cpus", "Number of CPUs.", node, h.cpu_count());
      if (h.has_memory_total_bytes()) {
        b->Gauge("stepwatch_host_memory_total_bytes", "Host memory total.", node,
                 static_cast<double>(h.memory_total_bytes()));
      }
      if (h.has_memory_available_bytes()) {
        b->Gauge("stepwatch_host_memory_available_bytes", "Host memory available.", node,
                 static_cast<double>(h.memory_available_bytes()));
      }
      if (h.has_network_receive_bytes_total()) {
        b->Counter("stepwatch_host_network_receive_bytes_total",
                   "Bytes received on non-loopback interfaces since boot.", node,
                   static_cast<double>(h.network_receive_bytes_total()));
      }
      if (h.has_network_transmit_bytes_total()) {
        b->Counter("stepwatch_host_network_transmit_bytes_total",
                   "Bytes sent on non-loopback interfaces since boot.", node,
                   static_cast<double>(h.network_transmit_bytes_total()));
      }
      if (h.has_memory_bandwidth_bytes_per_second()) {
        b->Gauge("stepwatch_host_memory_bandwidth_bytes_per_second",
                 "Host memory bandwidth (resctrl or perf uncore counters).", node,
                 h.memory_bandwidth_bytes_per_second());
      }
    }
  }
}

void AddCollectorHealth(const StateSnapshot& s, Builder* b) {
  const CollectorCounters& c = s.counters;
  b->Counter("stepwatch_collector_batches_received_total", "Report batches received.", {},
             c.batches_received);
  b->Counter("stepwatch_collector_duplicate_batches_total",
             "Report batches received again (resent after a reconnect) and ignored.", {},
             c.duplicate_batches);
  b->Counter("stepwatch_collector_steps_received_total", "Step events received.", {},
             c.steps_received);
  const char* kStepsRejected = "Step events dropped, by reason: invalid, limit.";
  for (const char* reason : {"invalid", "limit"}) {
    auto it = c.steps_rejected.find(reason);
    b->Counter("stepwatch_collector_steps_rejected_total", kStepsRejected, {{"reason", reason}},
               it == c.steps_rejected.end() ? 0 : it->second);
  }
  b->Counter("stepwatch_collector_gpu_samples_received_total", "GPU samples received.", {},
             c.gpu_samples_received);
  b->Counter("stepwatch_collector_host_samples_received_total", "Host samples received.", {},
             c.host_samples_received);
  b->Counter("stepwatch_collector_ingest_errors_total",
             "Malformed batches and failed ingest streams.", {}, c.ingest_errors);
  b->Counter("stepwatch_collector_state_save_errors_total", "Failures to write the state file.", {},
             c.state_save_errors);
  const char* kLimitHits =
      "Data dropped because a limit was reached: jobs, ranks_per_job, nodes, gpus_per_node.";
  for (const char* limit : {"jobs", "ranks_per_job", "nodes", "gpus_per_node"}) {
    auto it = c.limit_hits.find(limit);
    b->Counter("stepwatch_collector_limit_hits_total", kLimitHits, {{"limit", limit}},
               it == c.limit_hits.end() ? 0 : it->second);
  }
  const char* kExpired = "Jobs and nodes forgotten after being unseen for --expire.";
  for (const char* kind : {"job", "node"}) {
    auto it = c.expired.find(kind);
    b->Counter("stepwatch_collector_expired_total", kExpired, {{"kind", kind}},
               it == c.expired.end() ? 0 : it->second);
  }
  const char* kRefused =
      "Calls and batches refused: unauthenticated, permission_denied (a token of another role), "
      "node_mismatch (a batch for another node than its certificate), rank_exit_foreign (the "
      "exit of a rank its node never reported).";
  for (const char* reason :
       {"unauthenticated", "permission_denied", "node_mismatch", "rank_exit_foreign"}) {
    auto it = c.refused.find(reason);
    b->Counter("stepwatch_collector_requests_refused_total", kRefused, {{"reason", reason}},
               it == c.refused.end() ? 0 : it->second);
  }
  const char* kSeriesDropped =
      "Series left out of /metrics by a cap, summed over scrapes, by family: rank (the per-rank "
      "series, --max-rank-series), finding (stepwatch_finding, --max-finding-series).";
  b->Counter("stepwatch_collector_series_dropped_total", kSeriesDropped, {{"family", "rank"}},
             c.rank_series_dropped);
  b->Counter("stepwatch_collector_series_dropped_total", kSeriesDropped, {{"family", "finding"}},
             c.finding_series_dropped);
  b->Counter("stepwatch_collector_clock_skew_corrected_total",
             "Sender timestamps replaced by the collector's time because they were further than "
             "--max-clock-skew from its clock.",
             {}, c.clock_skew_corrected);
  b->Counter("stepwatch_collector_rank_exits_received_total",
             "Rank exits reported by agents (the rank's sender process was gone).", {},
             c.rank_exits_received);
  b->Counter("stepwatch_collector_jobs_finished_total",
             "Jobs forgotten because every reporting rank's process exited.", {}, c.jobs_finished);
  b->Gauge("stepwatch_collector_agents_connected", "Agents with an open ingest stream.", {},
           s.agents_connected);
  b->Gauge("stepwatch_collector_jobs", "Jobs tracked.", {}, s.jobs.size());
  b->Gauge("stepwatch_collector_nodes", "Nodes tracked.", {}, s.nodes.size());
}

}  // namespace

std::vector<MetricFamily> BuildMetricFamilies(const StateSnapshot& snapshot,
                                              const MetricsOptions& options) {
  Builder b;
  AddJobs(snapshot, &b);
  AddRanks(snapshot, &b);
  AddFindings(snapshot, options, &b);
  AddNodes(snapshot, &b);
  AddCollectorHealth(snapshot, &b);
  return b.Take();
}

std::vector<MetricFamily> StateCollectable::Collect() const {
  StateSnapshot snapshot = state_->Snapshot();
  const size_t cap = static_cast<size_t>(std::max(0, options_.max_finding_series));
  if (snapshot.findings.size() > cap) finding_series_dropped_ += snapshot.findings.size() - cap;
  snapshot.counters.finding_series_dropped = finding_series_dropped_.load();
  return BuildMetricFamilies(snapshot, options_);
}

}  // namespace stepwatch::collector
