#include "agent/agent_metrics.h"

#include <exception>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/peer_strings.h"
#include "agent/spool.h"
#include "agent/step_event_parser.h"
#include "common/net.h"
#include "metrics/node_metric_table.h"
#include "prometheus/client_metric.h"

namespace stepwatch::agent {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

class Families {
 public:
  explicit Families(std::vector<MetricFamily>* out) : out_(out) {}

  // Returns the family, creating it (with HELP and TYPE) on first use.
  MetricFamily* Get(const std::string& name, const std::string& help, MetricType type) {
    for (auto& f : *out_) {
      if (f.name == name) return &f;
    }
    out_->push_back(MetricFamily{name, help, type, {}});
    return &out_->back();
  }

  void Add(const std::string& name, const std::string& help, MetricType type,
           std::vector<ClientMetric::Label> labels, double value) {
    MetricFamily* f = Get(name, help, type);
    ClientMetric m;
    m.label = std::move(labels);
    if (type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f->metric.push_back(std::move(m));
  }

 private:
  std::vector<MetricFamily>* out_;
};

constexpr MetricType kGauge = MetricType::Gauge;
constexpr MetricType kCounter = MetricType::Counter;

// Every series of table metric `metric` for one sample, labelled `first` (node, and gpu for GPU
// metrics), then the metric's own labels.
template <typename Metric, typename Sample>
void AddTableSeries(const Metric& metric, const Sample& sample,
                    const std::vector<ClientMetric::Label>& first, Families* f) {
  metrics::ForEachSeries(metric, sample, [&](const std::vector<std::string>& values, double v) {
    std::vector<ClientMetric::Label> labels = first;
    for (size_t i = 0; i < values.size(); ++i) labels.push_back({metric.labels[i], values[i]});
    f->Add(absl::StrCat(metrics::kAgentPrefix, metric.name), metric.help, metric.type,
           std::move(labels), v);
  });
}

void AddGpuSeries(const std::string& node, const v1::GpuSample& g, Families* f) {
  // The Kubernetes pod the GPU is allocated to (agent/kubelet_pods.h), empty when none: always
  // there, so that a scrape with honor_labels never gives it the agent's own pod.
  const std::vector<ClientMetric::Label> labels = {{"node", node},
                                                   {"gpu", absl::StrCat(g.index())},
                                                   {"namespace", g.kubernetes_pod().namespace_()},
                                                   {"pod", g.kubernetes_pod().pod()},
                                                   {"container", g.kubernetes_pod().container()}};
  for (const metrics::GpuMetric& m : metrics::GpuMetrics()) AddTableSeries(m, g, labels, f);
}

void AddHostSeries(const std::string& node, const v1::HostSample& h, Families* f) {
  for (const metrics::HostMetric& m : metrics::HostMetrics()) {
    AddTableSeries(m, h, {{"node", node}}, f);
  }
}

void AddIngestFamilies(const std::string& node, const IngestStats& s, Families* fam) {
  Families& f = *fam;
  const std::vector<ClientMetric::Label> nl = {{"node", node}};
  f.Add("stepwatch_agent_datagrams_received_total", "Datagrams read from the ingest socket.",
        kCounter, nl, static_cast<double>(s.datagrams_total));
  f.Add("stepwatch_agent_events_received_total", "Valid step events received.", kCounter, nl,
        static_cast<double>(s.events_accepted_total));
  for (int i = 0; i < kRejectReasonCount; ++i) {
    f.Add("stepwatch_agent_events_rejected_total", "Datagrams rejected, by reason.", kCounter,
          {{"node", node}, {"reason", RejectReasonName(static_cast<RejectReason>(i))}},
          static_cast<double>(s.rejected_total[i]));
  }
  f.Add("stepwatch_agent_receive_errors_total", "Errors reading the ingest socket.", kCounter, nl,
        static_cast<double>(s.receive_errors_total));
  f.Add("stepwatch_agent_seqpacket_messages_received_total",
        "Messages read from connections to the seqpacket ingest socket.", kCounter, nl,
        static_cast<double>(s.seqpacket_messages_total));
  f.Add("stepwatch_agent_connections_accepted_total",
        "Connections accepted on the seqpacket ingest socket.", kCounter, nl,
        static_cast<double>(s.connections_accepted_total));
  f.Add("stepwatch_agent_connections_refused_total",
        "Connections closed at once because --max-connections were open.", kCounter, nl,
        static_cast<double>(s.connections_refused_total));
  f.Add("stepwatch_agent_connections", "Open connections on the seqpacket ingest socket.", kGauge,
        nl, static_cast<double>(s.connections_open));
  for (const auto& [uid, n] : s.tenant_refusals_by_uid) {
    f.Add("stepwatch_agent_tenant_refusals_total",
          "Step events refused because their process or user owns --max-ranks-per-process or "
          "--max-ranks-per-user (job, rank) pairs, by uid (uid=\"other\" past 32 users).",
          kCounter, {{"node", node}, {"uid", uid}}, static_cast<double>(n));
  }
  f.Add("stepwatch_agent_unknown_sender_events_total",
        "Accepted step events whose sender pid the kernel did not tell (0: a process outside the "
        "agent's pid namespace): no rank ownership, tenant bound or exit tracking for them.",
        kCounter, nl, static_cast<double>(s.unknown_sender_events_total));
  f.Add("stepwatch_agent_own_pid_namespace",
        "1 when the agent runs in a pid namespace of its own (senders outside it have pid 0).",
        kGauge, nl, s.own_pid_namespace ? 1 : 0);
  for (const auto& [job, dropped] : s.client_dropped_by_job) {
    f.Add("stepwatch_agent_client_dropped_events_total",
          "Step events that training processes report they failed to send (the \"dropped\" "
          "field), by job; the least recently seen jobs are forgotten beyond a bound.",
          kCounter, {{"node", node}, {"job", job}}, static_cast<double>(dropped));
  }
}

// The router's own counters and one set of series per collector link.
void AddRouterFamilies(const std::string& node, const CollectorRouterStats& r, Families* fam) {
  Families& f = *fam;
  const std::vector<ClientMetric::Label> nl = {{"node", node}};
  f.Add("stepwatch_agent_collectors", "Collectors in the current (resolved) --collector list.",
        kGauge, nl, static_cast<double>(r.links.size()));
  f.Add("stepwatch_agent_collectors_added_total",
        "Collectors that appeared in the --collector list (a link was opened).", kCounter, nl,
        static_cast<double>(r.links_added_total));
  f.Add("stepwatch_agent_collectors_removed_total",
        "Collectors that left the --collector list (their link was flushed and closed).", kCounter,
        nl, static_cast<double>(r.links_removed_total));
  f.Add("stepwatch_agent_collector_resolve_errors_total",
        "Failed resolutions of --collector (the last list was kept).", kCounter, nl,
        static_cast<double>(r.resolve_errors_total));
  f.Add("stepwatch_agent_collectors_without_spool",
        "Collectors whose link runs without the --spool-dir it should have (a full disk at "
        "its start): their batches are held in memory only.",
        kGauge, nl, static_cast<double>(r.links_without_spool));
  f.Add("stepwatch_agent_job_moves_total",
        "Times a job's collectors changed (failover, return, list change).", kCounter, nl,
        static_cast<double>(r.job_moves_total));
  for (const CollectorLinkStats& l : r.links) {
    const std::vector<ClientMetric::Label> cl = {{"node", node}, {"collector", l.collector}};
    f.Add("stepwatch_agent_collector_connected", "1 while the stream to this collector is open.",
          kGauge, cl, l.connected ? 1 : 0);
    f.Add("stepwatch_agent_collector_reachable",
          "1 while this collector is connected or down for less than --failover-after (it "
          "keeps its jobs).",
          kGauge, cl, l.reachable ? 1 : 0);
    f.Add("stepwatch_agent_collector_jobs", "Recent jobs of this node that this collector holds.",
          kGauge, cl, static_cast<double>(l.jobs));
    f.Add("stepwatch_agent_collector_buffer_batches",
          "Report batches held until this collector acknowledges them.", kGauge, cl,
          static_cast<double>(l.buffered_batches));
    f.Add("stepwatch_agent_collector_buffer_bytes", "Serialized size of the batches held.", kGauge,
          cl, static_cast<double>(l.buffered_bytes));
    f.Add("stepwatch_agent_collector_batches_sent_total",
          "Report batches written to this collector, resends included.", kCounter, cl,
          static_cast<double>(l.batches_sent_total));
    f.Add("stepwatch_agent_collector_batches_acknowledged_total",
          "Report batches this collector acknowledged.", kCounter, cl,
          static_cast<double>(l.batches_acknowledged_total));
    f.Add("stepwatch_agent_collector_batches_dropped_total",
          "Batches for this collector dropped unacknowledged because its buffer was full.",
          kCounter, cl, static_cast<double>(l.batches_dropped_total));
    f.Add("stepwatch_agent_collector_connects_total", "Streams opened to this collector.", kCounter,
          cl, static_cast<double>(l.connects_total));
  }
}

// Series labelled with the node only, named "stepwatch_agent_" + name.
struct NodeSeries {
  Families* f;
  const std::vector<ClientMetric::Label>& nl;
  void counter(const char* name, const char* help, uint64_t v) const {
    f->Add(absl::StrCat("stepwatch_agent_", name), help, kCounter, nl, static_cast<double>(v));
  }
  void gauge(const char* name, const char* help, double v) const {
    f->Add(absl::StrCat("stepwatch_agent_", name), help, kGauge, nl, v);
  }
};

void AddSpoolFamilies(const std::string& node, const SpoolStats& s, Families* f) {
  const std::vector<ClientMetric::Label> nl = {{"node", node}};
  const NodeSeries series{f, nl};
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    series.counter(name, help, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) { series.gauge(name, help, v); };
  gauge("spool_batches", "Report batches in the spool directory.", static_cast<double>(s.batches));
  gauge("spool_bytes", "Bytes of report batches in the spool directory.",
        static_cast<double>(s.bytes));
  counter("spool_batches_replayed_total",
          "Batches found in the spool at start (left by an earlier process) and sent again.",
          s.replayed_batches_total);
  counter("spool_batches_dropped_total",
          "Spooled batches deleted unacknowledged because the spool was full.",
          s.dropped_batches_total);
  counter("spool_corrupt_records_total", "Unreadable spool records skipped and deleted.",
          s.corrupt_records_total);
  counter("spool_write_errors_total", "Failed writes to the spool directory.",
          s.write_errors_total);
  counter("spool_boot_rewrites_in_place_total",
          "Spool lease writes done in place because the disk had no room for a new file.",
          s.boot_rewrites_in_place_total);
}

// The links' totals (one link's stats, or the router's sums).
void AddLinkTotals(const std::string& node, const CollectorLinkStats& s,
                   uint64_t buffer_capacity_batches, Families* fam) {
  Families& f = *fam;
  const std::vector<ClientMetric::Label> nl = {{"node", node}};
  const NodeSeries series{fam, nl};
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    series.counter(name, help, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) { series.gauge(name, help, v); };
  counter("events_dropped_total", "Step events dropped because too many were pending.",
          s.events_dropped_total);
  counter("events_shipped_total",
          "Step events put into batches, summed over collectors (an event sent to R "
          "collectors counts R times).",
          s.events_shipped_total);
  counter("batches_created_total", "Report batches created.", s.batches_created_total);
  counter("batches_sent_total", "Report batches written to the collector, resends included.",
          s.batches_sent_total);
  counter("batches_resent_total", "Report batches written again after a reconnect.",
          s.batches_resent_total);
  counter("batches_acknowledged_total", "Report batches acknowledged by the collector.",
          s.batches_acknowledged_total);
  counter("batches_dropped_total",
          "Unacknowledged report batches dropped because the buffer was full.",
          s.batches_dropped_total);
  counter("connects_total", "Streams opened to the collector.", s.connects_total);
  counter("connect_attempts_total", "Attempts to open a stream to the collector.",
          s.connect_attempts_total);
  counter("gpu_sample_errors_total", "Failed GPU readings.", s.gpu_sample_errors_total);
  counter("host_sample_errors_total", "Failed host readings.", s.host_sample_errors_total);
  for (int i = 0; i < kPeerStringFieldCount; ++i) {
    f.Add("stepwatch_agent_peer_strings_bounded_total",
          "NVML and host strings cut to their bound or with unprintable bytes replaced, by field.",
          kCounter,
          {{"node", node}, {"field", PeerStringFieldName(static_cast<PeerStringField>(i))}},
          static_cast<double>(s.peer_strings_bounded_total[i]));
  }
  counter("rank_exits_total",
          "Ranks reported to the collector as exited (their sender process was gone).",
          s.rank_exits_total);
  gauge("buffer_batches", "Report batches held until the collector acknowledges them.",
        static_cast<double>(s.buffered_batches));
  gauge("buffer_bytes", "Serialized size of the batches held.",
        static_cast<double>(s.buffered_bytes));
  gauge("buffer_capacity_batches",
        "Most report batches held per collector before the oldest are dropped.",
        static_cast<double>(buffer_capacity_batches));
  gauge("pending_events", "Step events waiting for the next batch.",
        static_cast<double>(s.pending_events));
  gauge("connected",
        "1 while the stream to every collector that holds this node's data is open (none of it "
        "is only buffered).",
        s.connected ? 1 : 0);
  if (s.spool) AddSpoolFamilies(node, *s.spool, &f);
  gauge("spool_unspooled_batches",
        "Batches held in memory only because the spool could not take them (a full disk): a "
        "crash of the agent now loses them.",
        static_cast<double>(s.unspooled_batches));
  gauge("spool_unspooled_events", "Step events in spool_unspooled_batches.",
        static_cast<double>(s.unspooled_events));
  counter("spool_unspooled_events_total",
          "Step events put into batches that could not be spooled when cut.",
          s.events_unspooled_total);
  counter("spool_batches_respooled_total",
          "Batches written to the spool on a retry, after being held in memory only.",
          s.batches_respooled_total);
}

// Reloads of the client certificate, where an operator sees a rotation that was refused.
void AddTlsFamilies(const std::string& node, const security::CheckedKeyCertPair::Stats& s,
                    Families* f) {
  const std::vector<ClientMetric::Label> nl = {{"node", node}};
  f->Add("stepwatch_agent_tls_reloads_total",
         "New --tls-cert/--tls-key pairs taken without a restart.", kCounter, nl,
         static_cast<double>(s.reloads));
  f->Add("stepwatch_agent_tls_reload_errors_total",
         "Contents of --tls-cert/--tls-key refused at a reload (unreadable, or the key is not the "
         "certificate's); the previous pair kept being used.",
         kCounter, nl, static_cast<double>(s.reload_errors));
}

}  // namespace

std::vector<MetricFamily> AgentCollectable::Collect() const {
  std::vector<MetricFamily> out;
  Families f(&out);
  const std::string& node = sources_.node;
  const std::vector<ClientMetric::Label> nl = {{"node", node}};

  if (sources_.ingest) AddIngestFamilies(node, sources_.ingest(), &f);
  std::optional<CollectorLinkStats> totals;
  if (sources_.collectors) {
    const CollectorRouterStats r = sources_.collectors();
    totals = r.total;
    AddRouterFamilies(node, r, &f);
  } else if (sources_.link) {
    totals = sources_.link();
  }
  if (totals) AddLinkTotals(node, *totals, sources_.buffer_capacity_batches, &f);
  if (sources_.tls) AddTlsFamilies(node, sources_.tls(), &f);
  if (sources_.samples) {
    const NodeReading snap = sources_.samples();
    f.Add("stepwatch_agent_nvml_available", "1 when NVML was loaded and initialised.", kGauge, nl,
          snap.node.nvml_available() ? 1 : 0);
    f.Add("stepwatch_agent_gpus", "GPUs NVML reports on the node.", kGauge, nl,
          snap.node.gpu_count());
    for (const v1::GpuSample& g : snap.gpus) AddGpuSeries(node, g, &f);
    if (snap.host) AddHostSeries(node, *snap.host, &f);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const http::MetricsEndpointOptions& options,
    std::shared_ptr<prometheus::Collectable> collectable) {
  const std::string& listen = options.listen;
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->collectable_ = std::move(collectable);
  absl::StatusOr<std::unique_ptr<http::MetricsEndpoint>> endpoint =
      http::MetricsEndpoint::Start(options, server->collectable_);
  if (!endpoint.ok()) {
    if (absl::IsInvalidArgument(endpoint.status())) return endpoint.status();
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, ": ", endpoint.status().message()));
  }
  server->endpoint_ = *std::move(endpoint);
  server->port_ = server->endpoint_->port();
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace stepwatch::agent
