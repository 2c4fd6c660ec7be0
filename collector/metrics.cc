#include "collector/metrics.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/engine.h"
#include "collector/convert.h"
#include "collector/pod_index.h"
#include "metrics/node_metric_table.h"

namespace stepwatch::collector {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// Collects families in a fixed order; families that end up without samples are left out. While a
// group is set, each series counts against the total cap; one over it is dropped and counted under
// the group instead.
class Builder {
 public:
  Builder(int max_series, SeriesDrops* dropped) : max_series_(max_series), dropped_(dropped) {}
  // nullptr: series outside the cap (the collector's own health).
  void SetGroup(const char* group) { group_ = group; }
  // Whether one more series of the current group fits; counts it either way.
  bool Room() {
    if (group_ == nullptr) return true;
    if (max_series_ <= 0 || series_ < max_series_) {
      ++series_;
      return true;
    }
    ++(*dropped_)[group_];
    return false;
  }
  // Counts a series left out by another cap under `group`.
  void Drop(const char* group) { ++(*dropped_)[group]; }
  // Whether the total cap is reached: callers then count what they leave out without building it.
  bool Full() const { return max_series_ > 0 && series_ >= max_series_; }
  void DropCurrent(uint64_t n) {
    if (n > 0) (*dropped_)[group_] += n;
  }
  MetricFamily* Family(const std::string& name, const std::string& help, MetricType type) {
    auto it = index_.find(name);
    if (it != index_.end()) return &families_[it->second];
    index_.emplace(name, families_.size());
    families_.push_back(MetricFamily{name, help, type, {}});
    return &families_.back();
  }
  void Gauge(const std::string& name, const std::string& help, Labels labels, double value) {
    if (!Room()) return;
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    Family(name, help, MetricType::Gauge)->metric.push_back(std::move(m));
  }
  void Counter(const std::string& name, const std::string& help, Labels labels, double value) {
    if (!Room()) return;
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
  const int max_series_;
  SeriesDrops* const dropped_;
  const char* group_ = nullptr;
  int series_ = 0;
};

std::string RankLabel(int rank) { return rank < 0 ? "" : absl::StrCat(rank); }

// `labels` with the Kubernetes labels (empty when unknown: every series of the family has them),
// sorted by name like every collector series.
Labels WithPod(Labels labels, const PodNames& pod) {
  labels.push_back({"container", pod.container});
  labels.push_back({"namespace", pod.namespace_name});
  labels.push_back({"pod", pod.pod});
  std::sort(
      labels.begin(), labels.end(),
      [](const ClientMetric::Label& x, const ClientMetric::Label& y) { return x.name < y.name; });
  return labels;
}

// The rank's pod as its steps name it (not its GPU's: a rank's labels must not depend on which
// nodes a scrape exports).
PodNames RankPod(const StateSnapshot& s, const std::string& job, int rank) {
  if (s.rank_pods == nullptr) return {};
  const PodNames* p = s.rank_pods->OfRank(job, rank);
  return p == nullptr ? PodNames{} : *p;
}

void AddJobs(const StateSnapshot& s, Builder* b) {
  b->SetGroup("job");
  for (const analysis::JobSnapshot& j : s.jobs) {
    const Labels job{{"job", j.job}};
    b->Gauge("stepwatch_job_step_seconds", "Recent median step time of the job.", job,
             j.median_step_seconds);
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
    b->Counter("stepwatch_job_steps_incomplete_total",
               "Steps analysed with fewer ranks than the world size (completed by --step_grace or "
               "the pending cap).",
               job, static_cast<double>(j.incomplete_steps));
    b->Counter("stepwatch_job_step_samples_late_total",
               "Rank samples that came after their step was analysed, left out of the analysis.",
               job, static_cast<double>(j.late_samples));
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

void AddRanks(const StateSnapshot& s, bool flagged, Builder* b) {
  b->SetGroup("rank");
  for (const auto& [job, r] : s.top_ranks) {
    const Labels labels = WithPod({{"job", job}, {"node", r.node}, {"rank", RankLabel(r.rank)}},
                                  RankPod(s, job, r.rank));
    if (flagged) {
      if (r.straggler) {
        b->Gauge("stepwatch_straggler",
                 "1 while the rank is flagged: alone, in a slow node or in the slowest stage of "
                 "an imbalanced pipeline.",
                 labels, 1);
      }
      continue;
    }
    b->Gauge("stepwatch_rank_busy_vs_median_ratio",
             "Busy time (data + compute) relative to the rank's peers' median, for every flagged "
             "rank and each job's slowest ranks.",
             labels, r.busy_vs_median_ratio);
    b->Gauge("stepwatch_rank_busy_seconds",
             "Median busy time (data + compute), for every flagged rank and each job's slowest "
             "ranks.",
             labels, r.busy_seconds);
  }
}

// The labels of a finding's series (stepwatch_finding and its size).
Labels FindingLabels(const analysis::Finding& f, const PodNames& pod) {
  return WithPod({{"cause", analysis::CauseName(f.cause)},
                  {"device", f.device},
                  {"gpu", RankLabel(f.gpu)},
                  {"job", f.job},
                  {"kind", analysis::FindingKindName(f.kind)},
                  {"node", f.node},
                  {"rank", RankLabel(f.rank)},
                  {"severity", analysis::SeverityName(f.severity)},
                  {"stage", RankLabel(f.stage)}},
                 pod);
}

// The figure that says how large a finding is (what its summary's "+24%" or "1.4x" is worded
// from), so that alerts can carry it; none for kinds without one.
std::optional<double> FindingSizeRatio(const analysis::Finding& f) {
  const analysis::Evidence& e = f.evidence;
  switch (f.kind) {
    case analysis::FindingKind::kStraggler:
    case analysis::FindingKind::kSlowNode:
      return e.busy_vs_median_ratio;
    case analysis::FindingKind::kPipelineImbalance:
      return e.stage_vs_median_ratio;
    case analysis::FindingKind::kRegression:
      return e.step_vs_baseline_ratio;
    case analysis::FindingKind::kScalingEfficiency:
      return e.scaling_efficiency_ratio;
    default:
      return std::nullopt;
  }
}

void AddFindings(const StateSnapshot& s, const MetricsOptions& o, Builder* b) {
  b->SetGroup("finding");
  // The counts first: complete even when the series of single findings are cut.
  std::map<std::tuple<std::string, std::string, std::string>, int> counts;
  for (const analysis::Finding& f : s.findings) {
    ++counts[{f.job, analysis::FindingKindName(f.kind), analysis::SeverityName(f.severity)}];
  }
  for (const auto& [key, n] : counts) {
    const auto& [job, kind, severity] = key;
    b->Gauge("stepwatch_findings", "Active findings by job, kind and severity.",
             {{"job", job}, {"kind", kind}, {"severity", severity}}, n);
  }
  int finding_series = 0;
  const GpuPodLookup gpu_pods = GpuPodsOf(s.nodes);
  for (const analysis::Finding& f : s.findings) {
    const PodNames pod = AttributeFinding(f, s.rank_pods.get(), gpu_pods);
    if (f.kind == analysis::FindingKind::kUnderutilizedGpu) {
      b->Gauge("stepwatch_gpu_underutilized", "1 while the GPU is flagged underutilized.",
               WithPod({{"gpu", RankLabel(f.gpu)}, {"job", f.job}, {"node", f.node}}, pod), 1);
    }
    if (finding_series >= o.max_finding_series) {
      b->Drop("finding");
      continue;
    }
    ++finding_series;
    const Labels labels = FindingLabels(f, pod);
    b->Gauge(
        "stepwatch_finding",
        "1 per active finding (bounded in number); cause is the primary cause, device the network "
        "port of a nic_health finding (empty otherwise), stage the "
        "pipeline stage (empty when none); namespace, pod and container the Kubernetes pod "
        "it is about (empty when unknown or not one).",
        labels, 1);
    if (const std::optional<double> size = FindingSizeRatio(f); size.has_value()) {
      b->Gauge("stepwatch_finding_size_ratio",
               "How large an active finding is, with the labels of its stepwatch_finding series: "
               "straggler and slow_node: busy time over the peers' median; pipeline_imbalance: "
               "the slowest stage's busy time over the other stages' median; regression: the step "
               "time over its baseline; scaling_efficiency: the efficiency.",
               labels, *size);
    }
  }
}

// Every series of table metric `m` (named `name`) for one sample, labelled gpu (unless empty),
// node and the metric's own labels, sorted by name like every collector series.
template <typename Metric, typename Sample>
void AddTableSeries(const Metric& m, const std::string& name, const Sample& sample,
                    const std::string& node, const std::string& gpu, Builder* b,
                    const v1::KubernetesPod* pod = nullptr) {
  metrics::ForEachSeries(m, sample, [&](const std::vector<std::string>& values, double value) {
    Labels labels;
    if (!gpu.empty()) labels.push_back({"gpu", gpu});
    labels.push_back({"node", node});
    for (size_t i = 0; i < values.size(); ++i) labels.push_back({m.labels[i], values[i]});
    if (pod != nullptr) {
      // A GPU's series: its pod's names, empty when it is in none.
      labels.push_back({"container", pod->container()});
      labels.push_back({"namespace", pod->namespace_()});
      labels.push_back({"pod", pod->pod()});
    }
    if (!values.empty() || pod != nullptr) {
      std::sort(labels.begin(), labels.end(),
                [](const ClientMetric::Label& x, const ClientMetric::Label& y) {
                  return x.name < y.name;
                });
    }
    if (m.type == MetricType::Counter) {
      b->Counter(name, m.help, std::move(labels), value);
    } else {
      b->Gauge(name, m.help, std::move(labels), value);
    }
  });
}

// A node whose series are exported, and which of them.
struct ExportedNode {
  const NodeSnapshot* view = nullptr;
  // Its host and GPU readings; without them only its up and last-seen series (a quiet node).
  bool readings = true;
  // The GPUs whose readings are exported; null: every GPU of the node.
  const std::set<int>* gpus = nullptr;
  bool Exports(const v1::GpuSample& g) const {
    return readings && (gpus == nullptr || gpus->count(static_cast<int>(g.index())) > 0);
  }
};

// The nodes of the snapshot to export, in its order (by name). Under kFindings: those current
// findings name (their readings, of the GPUs involved) and the quiet ones (up 0, no readings: an
// agent that stopped reaching this collector is news only the collector has); every other node's
// readings are on its agent's /metrics.
std::vector<ExportedNode> NodesToExport(const StateSnapshot& s, const MetricsOptions& o,
                                        const std::map<std::string, InvolvedNode>& involved) {
  std::vector<ExportedNode> out;
  if (o.export_node_metrics == NodeMetricsExport::kAll) {
    out.reserve(s.nodes.size());
    for (const NodeSnapshot& n : s.nodes) out.push_back({&n, true, nullptr});
    return out;
  }
  for (const NodeSnapshot& n : s.nodes) {
    const bool quiet = s.now_unix_nanos - n.last_seen_unix_nanos > s.node_down_nanos;
    auto it = involved.find(n.node);
    if (it != involved.end()) {
      out.push_back({&n, true, it->second.every_gpu ? nullptr : &it->second.gpus});
    } else if (quiet) {
      out.push_back({&n, false, nullptr});
    }
  }
  return out;
}

// The GPU metrics of `importance` for every exported GPU, metric by metric: under the total cap,
// every GPU gets a series of one metric before any GPU gets one of the next.
void AddGpuMetrics(const std::vector<ExportedNode>& nodes, metrics::Importance importance,
                   Builder* b) {
  b->SetGroup("gpu");
  for (const metrics::GpuMetric& m : metrics::GpuMetrics()) {
    if (m.importance != importance || !metrics::CollectorExports(m)) continue;
    const std::string name = absl::StrCat(metrics::kCollectorPrefix, m.name);
    for (const ExportedNode& e : nodes) {
      for (const v1::GpuSample& g : e.view->gpus) {
        if (!e.Exports(g)) continue;
        if (b->Full()) {
          // Only counted: building 100,000s of label sets to drop them would slow every scrape.
          b->DropCurrent(metrics::SeriesCount(m, g));
        } else {
          AddTableSeries(m, name, g, e.view->node, absl::StrCat(g.index()), b, &g.kubernetes_pod());
        }
      }
    }
  }
}

void AddNodes(const StateSnapshot& s, const std::vector<ExportedNode>& nodes, Builder* b) {
  b->SetGroup("node");
  for (const ExportedNode& e : nodes) {
    const NodeSnapshot& n = *e.view;
    const bool up = s.now_unix_nanos - n.last_seen_unix_nanos <= s.node_down_nanos;
    b->Gauge("stepwatch_node_up", "1 while the node's agent reports, 0 when it went quiet.",
             {{"node", n.node}}, up ? 1 : 0);
  }
  // Utilization and SM activity of every GPU come before the rest of any node's series.
  AddGpuMetrics(nodes, metrics::Importance::kHigh, b);
  b->SetGroup("node");
  for (const ExportedNode& e : nodes) {
    if (b->Full()) {
      b->DropCurrent(2);
      continue;
    }
    const NodeSnapshot& n = *e.view;
    const Labels node{{"node", n.node}};
    b->Gauge("stepwatch_node_last_seen_timestamp_seconds",
             "When the node's agent last reported, Unix seconds.", node,
             n.last_seen_unix_nanos / 1e9);
    b->Gauge("stepwatch_node_nvml_available", "1 when the node's agent could load NVML.", node,
             n.info.nvml_available() ? 1 : 0);
  }
  AddGpuMetrics(nodes, metrics::Importance::kNormal, b);
  b->SetGroup("host");
  for (const ExportedNode& e : nodes) {
    const NodeSnapshot& n = *e.view;
    if (!e.readings || !n.host.has_value()) continue;
    for (const metrics::HostMetric& m : metrics::HostMetrics()) {
      if (!metrics::CollectorExports(m)) continue;
      if (b->Full()) {
        b->DropCurrent(metrics::SeriesCount(m, *n.host));
      } else {
        AddTableSeries(m, absl::StrCat(metrics::kCollectorPrefix, m.name), *n.host, n.node, "", b);
      }
    }
  }
}

// One counter series per key, labelled `label`="key": its count in `counts` (0 when absent).
void AddCountsByKey(const char* name, const char* help, const char* label,
                    std::initializer_list<const char*> keys,
                    const std::map<std::string, uint64_t>& counts, Builder* b) {
  for (const char* key : keys) {
    auto it = counts.find(key);
    b->Counter(name, help, {{label, key}}, it == counts.end() ? 0 : it->second);
  }
}

// What the collector received and stored (batches, steps, samples; the errors of ingest, of the
// state file and of the job reports), and what it dropped at a limit or forgot after --expire.
void AddIngestHealth(const StateSnapshot& s, Builder* b) {
  const CollectorCounters& c = s.counters;
  b->Counter("stepwatch_collector_batches_received_total", "Report batches received.", {},
             c.batches_received);
  b->Counter("stepwatch_collector_duplicate_batches_total",
             "Report batches received again (resent after a reconnect) and ignored.", {},
             c.duplicate_batches);
  b->Counter("stepwatch_collector_steps_received_total", "Step events received.", {},
             c.steps_received);
  const char* kStepsRejected =
      "Step events dropped, by reason: invalid, limit, foreign (a rank or job another node "
      "holds).";
  AddCountsByKey("stepwatch_collector_steps_rejected_total", kStepsRejected, "reason",
                 {"invalid", "limit", "foreign"}, c.steps_rejected, b);
  b->Counter("stepwatch_collector_gpu_samples_received_total", "GPU samples received.", {},
             c.gpu_samples_received);
  b->Counter("stepwatch_collector_host_samples_received_total", "Host samples received.", {},
             c.host_samples_received);
  b->Counter("stepwatch_collector_ingest_errors_total",
             "Malformed batches and failed ingest streams.", {}, c.ingest_errors);
  b->Counter("stepwatch_collector_state_save_errors_total", "Failures to write the state file.", {},
             c.state_save_errors);
  b->Counter("stepwatch_collector_report_save_errors_total",
             "Failed writes (and deletions) of job reports under --state-dir; unsaved reports "
             "stay in memory and are retried.",
             {}, s.report_save_errors);
  b->Gauge("stepwatch_collector_reports_unsaved",
           "Finished job reports not yet written under --state-dir (kept in memory, retried).", {},
           s.reports_unsaved);
  b->Gauge("stepwatch_collector_reports_unsaved_bytes",
           "Bytes of the unsaved job reports, charged against --max-memory-mib.", {},
           static_cast<double>(s.reports_unsaved_bytes));
  b->Counter("stepwatch_collector_journal_damaged_records_total",
             "Damaged records of DIR/dedupe.journal skipped at start: their batches are applied "
             "again if resent.",
             {}, c.journal_records_damaged);
  const char* kLimitHits =
      "Data dropped because a limit was reached: jobs, jobs_per_node (new jobs of a node that "
      "opened --max-jobs-per-node), ranks_per_job, nodes, gpus_per_node, memory (new jobs, "
      "ranks, nodes and GPUs beyond --max-memory-mib).";
  AddCountsByKey("stepwatch_collector_limit_hits_total", kLimitHits, "limit",
                 {"jobs", "jobs_per_node", "ranks_per_job", "nodes", "gpus_per_node", "memory"},
                 c.limit_hits, b);
  const char* kExpired = "Jobs and nodes forgotten after being unseen for --expire.";
  AddCountsByKey("stepwatch_collector_expired_total", kExpired, "kind", {"job", "node"}, c.expired,
                 b);
}

// Calls, batches and fields refused (in all, by node, as malformed), and ranks taken over.
void AddRefusalHealth(const CollectorCounters& c, Builder* b) {
  const char* kRefused =
      "Calls and batches refused: unauthenticated, permission_denied (a token of another role), "
      "node_mismatch (a batch for another node than its certificate), no_identity (a client "
      "certificate naming no node), rank_foreign (a step of a rank another node holds), "
      "job_foreign (a step rescaling a job whose ranks run on other nodes), rank_exit_foreign "
      "(the exit of a rank its node does not hold), jobs_per_node (see limit_hits).";
  AddCountsByKey("stepwatch_collector_requests_refused_total", kRefused, "reason",
                 {"unauthenticated", "permission_denied", "node_mismatch", "no_identity",
                  "rank_foreign", "job_foreign", "rank_exit_foreign", "jobs_per_node"},
                 c.refused, b);
  const char* kNodeRefusals =
      "Refusals caused by one node, by node and reason: rank_foreign, job_foreign, "
      "rank_exit_foreign, jobs_per_node. At most 64 nodes are named, the rest are node=\"_other\".";
  for (const auto& [key, n] : c.node_refusals) {
    b->Counter("stepwatch_collector_node_refusals_total", kNodeRefusals,
               {{"node", key.first}, {"reason", key.second}}, static_cast<double>(n));
  }
  const char* kMalformed =
      "Ingest batches refused before any of them was applied (the stream ends with "
      "INVALID_ARGUMENT), by reason: unparsable (not a ReportBatch protobuf), missing_field (no "
      "agent_id, boot_id or seq), bad_field (agent_id, boot_id or node over its bound or with "
      "control characters).";
  AddCountsByKey("stepwatch_collector_malformed_batches_total", kMalformed, "reason",
                 {"unparsable", "missing_field", "bad_field"}, c.malformed, b);
  const char* kFieldsRefused =
      "Fields of ingest batches over their bound or with control characters, by field and "
      "reason (too_long, control_character): agent_id, boot_id and node cost their batch, the "
      "others the item holding them (node description, GPU sample, host sample).";
  for (const char* field : kCheckedFields) {
    for (const char* reason : kFieldProblemReasons) {
      auto it = c.fields_refused.find({field, reason});
      b->Counter("stepwatch_collector_fields_refused_total", kFieldsRefused,
                 {{"field", field}, {"reason", reason}},
                 it == c.fields_refused.end() ? 0 : it->second);
    }
  }
  b->Counter("stepwatch_collector_rank_takeovers_total",
             "Ranks that another node took over after their node went silent for --expire or "
             "their process exited.",
             {}, c.rank_takeovers);
}

void AddCollectorHealth(const StateSnapshot& s, const SeriesDrops& dropped, Builder* b) {
  b->SetGroup(nullptr);
  AddIngestHealth(s, b);
  const CollectorCounters& c = s.counters;
  AddRefusalHealth(c, b);
  const char* kSeriesDropped =
      "Series left out of /metrics by a cap, summed over scrapes, by family: rank (per-rank "
      "series, --max-rank-series or --max-series), finding (stepwatch_finding, "
      "--max-finding-series or --max-series), job, node, gpu, host (--max-series).";
  for (const char* family : {"rank", "finding", "job", "node", "gpu", "host"}) {
    uint64_t n = 0;
    if (auto it = c.series_dropped.find(family); it != c.series_dropped.end()) n += it->second;
    if (auto it = dropped.find(family); it != dropped.end()) n += it->second;
    if (std::string(family) == "rank") n += c.rank_series_dropped;
    if (std::string(family) == "finding") n += c.finding_series_dropped;
    b->Counter("stepwatch_collector_series_dropped_total", kSeriesDropped, {{"family", family}},
               static_cast<double>(n));
  }
  b->Counter("stepwatch_collector_clock_skew_corrected_total",
             "Sender timestamps replaced by the collector's time because they were further than "
             "--max-clock-skew from its clock.",
             {}, c.clock_skew_corrected);
  b->Counter("stepwatch_collector_rank_exits_received_total",
             "Rank exits reported by agents (the rank's sender process was gone).", {},
             c.rank_exits_received);
  b->Counter("stepwatch_collector_jobs_finished_total",
             "Jobs forgotten because every reporting rank's process exited.", {}, c.jobs_finished);
  b->Counter("stepwatch_collector_jobs_moved_away_total",
             "Jobs forgotten because their agents moved every rank to other collectors.", {},
             c.jobs_moved_away);
  b->Gauge("stepwatch_collector_agents_connected", "Agents with an open ingest stream.", {},
           s.agents_connected);
  b->Gauge("stepwatch_collector_jobs", "Jobs tracked.", {}, s.jobs.size());
  b->Gauge("stepwatch_collector_nodes", "Nodes tracked.", {},
           std::max(s.nodes_tracked, s.nodes.size()));
  b->Gauge("stepwatch_collector_memory_accounted_bytes",
           "Bytes charged against the memory budget for the jobs, ranks, nodes and GPUs tracked.",
           {}, static_cast<double>(s.memory_accounted_bytes));
  b->Gauge("stepwatch_collector_memory_budget_bytes",
           "The memory budget (--max-memory-mib); 0: none.", {},
           static_cast<double>(s.memory_budget_bytes));
  // Per detector, as node_exporter times each collector: a detector whose cost grows shows here.
  for (const auto& [name, t] : s.detector_timings) {
    b->Counter("stepwatch_engine_detector_seconds_total",
               "Time the diagnosis engine spent in each detector.", {{"detector", name}},
               t.seconds);
    b->Counter("stepwatch_engine_detector_runs_total", "Calls of each detector.",
               {{"detector", name}}, static_cast<double>(t.runs));
  }
}

}  // namespace

std::vector<MetricFamily> BuildMetricFamilies(const StateSnapshot& snapshot,
                                              const MetricsOptions& options, SeriesDrops* dropped) {
  SeriesDrops local;
  Builder b(options.max_series, &local);
  // In order of importance, for the total cap.
  AddFindings(snapshot, options, &b);
  AddRanks(snapshot, /*flagged=*/true, &b);
  AddJobs(snapshot, &b);
  AddRanks(snapshot, /*flagged=*/false, &b);
  const std::map<std::string, InvolvedNode> involved =
      options.export_node_metrics == NodeMetricsExport::kAll ? std::map<std::string, InvolvedNode>()
                                                             : InvolvedNodes(snapshot.findings);
  AddNodes(snapshot, NodesToExport(snapshot, options, involved), &b);
  AddCollectorHealth(snapshot, local, &b);
  if (dropped != nullptr) {
    for (const auto& [family, n] : local) (*dropped)[family] += n;
  }
  return b.Take();
}

std::vector<MetricFamily> StateCollectable::Collect() const {
  // Under kFindings only the nodes exported are copied: a scrape costs what it shows.
  StateSnapshot snapshot = state_->Snapshot(options_.export_node_metrics == NodeMetricsExport::kAll
                                                ? NodeScope::kAll
                                                : NodeScope::kInvolved);
  {
    absl::MutexLock lock(&mu_);
    snapshot.counters.series_dropped = dropped_;  // earlier scrapes'
  }
  SeriesDrops now;
  std::vector<MetricFamily> families = BuildMetricFamilies(snapshot, options_, &now);
  absl::MutexLock lock(&mu_);
  for (const auto& [family, n] : now) dropped_[family] += n;
  return families;
}

}  // namespace stepwatch::collector
