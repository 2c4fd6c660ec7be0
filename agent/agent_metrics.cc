#include "agent/agent_metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "gpu/gpu_source.h"
#include "prometheus/exposer.h"

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

void AddGpuSeries(const std::string& node, const v1::GpuSample& g, Families* f) {
  const std::vector<ClientMetric::Label> labels = {{"node", node},
                                                   {"gpu", absl::StrCat(g.index())}};
  auto gauge = [&](const char* name, const char* help, double v) {
    f->Add(absl::StrCat("stepwatch_agent_gpu_", name), help, kGauge, labels, v);
  };
  f->Add("stepwatch_agent_gpu_info", "GPU identity; always 1.", kGauge,
         {{"node", node}, {"gpu", absl::StrCat(g.index())}, {"uuid", g.uuid()}, {"name", g.name()}},
         1);
  if (g.has_utilization_gpu_ratio()) {
    gauge("utilization_ratio", "Fraction of time a kernel was running (NVML utilization.gpu).",
          g.utilization_gpu_ratio());
  }
  if (g.has_utilization_memory_ratio()) {
    gauge("memory_utilization_ratio", "Fraction of time device memory was read or written.",
          g.utilization_memory_ratio());
  }
  if (g.has_memory_used_bytes()) {
    gauge("memory_used_bytes", "Device memory in use.", static_cast<double>(g.memory_used_bytes()));
  }
  if (g.has_memory_total_bytes()) {
    gauge("memory_total_bytes", "Device memory size.", static_cast<double>(g.memory_total_bytes()));
  }
  if (g.has_sm_clock_mhz()) gauge("sm_clock_hertz", "SM clock.", g.sm_clock_mhz() * 1e6);
  if (g.has_sm_clock_max_mhz()) {
    gauge("sm_clock_max_hertz", "Maximum SM clock.", g.sm_clock_max_mhz() * 1e6);
  }
  if (g.has_power_watts()) gauge("power_watts", "Power draw.", g.power_watts());
  if (g.has_power_limit_watts()) {
    gauge("power_limit_watts", "Power management limit.", g.power_limit_watts());
  }
  if (g.has_temperature_celsius()) {
    gauge("temperature_celsius", "GPU core temperature.", g.temperature_celsius());
  }
  if (g.has_throttle_reasons()) {
    gauge("throttle_reasons", "NVML clocks throttle reasons bitmask (0: not throttled).",
          static_cast<double>(g.throttle_reasons()));
  }
  if (g.has_pcie_tx_bytes_per_second()) {
    gauge("pcie_transmit_bytes_per_second", "PCIe transmit throughput.",
          g.pcie_tx_bytes_per_second());
  }
  if (g.has_pcie_rx_bytes_per_second()) {
    gauge("pcie_receive_bytes_per_second", "PCIe receive throughput.",
          g.pcie_rx_bytes_per_second());
  }
  if (g.has_nvlink_tx_bytes_per_second()) {
    gauge("nvlink_transmit_bytes_per_second", "NVLink transmit throughput, all links.",
          g.nvlink_tx_bytes_per_second());
  }
  if (g.has_nvlink_rx_bytes_per_second()) {
    gauge("nvlink_receive_bytes_per_second", "NVLink receive throughput, all links.",
          g.nvlink_rx_bytes_per_second());
  }
  if (g.has_sm_activity_ratio()) {
    gauge("sm_activity_ratio", "Fraction of SM cycles with work resident (GPM).",
          g.sm_activity_ratio());
  }
  if (g.has_dram_bandwidth_ratio()) {
    gauge("dram_bandwidth_ratio", "Fraction of peak DRAM bandwidth used (GPM).",
          g.dram_bandwidth_ratio());
  }
  if (g.has_tensor_activity_ratio()) {
    gauge("tensor_activity_ratio", "Fraction of cycles the tensor cores were active (GPM).",
          g.tensor_activity_ratio());
  }
  gauge("processes", "Processes with a compute context on the GPU.", g.pids_size());
  for (const char* metric : gpu::kGpuMetricNames) {
    const auto it = g.unavailable_metrics().find(metric);
    const bool available = it == g.unavailable_metrics().end();
    f->Add("stepwatch_agent_gpu_metric_available",
           "1 when the driver gives this reading for the GPU; reason says why not (not_supported, "
           "no_permission, missing_entry_point, mig_enabled, gpu_lost, error).",
           kGauge,
           {{"node", node},
            {"gpu", absl::StrCat(g.index())},
            {"metric", metric},
            {"reason", available ? std::string("ok") : it->second}},
           available ? 1 : 0);
  }
}

void AddHostSeries(const std::string& node, const v1::HostSample& h, Families* f) {
  const std::vector<ClientMetric::Label> labels = {{"node", node}};
  auto add = [&](const char* name, const char* help, MetricType type, double v) {
    f->Add(absl::StrCat("stepwatch_agent_host_", name), help, type, labels, v);
  };
  if (h.has_cpu_utilization_ratio()) {
    add("cpu_utilization_ratio", "Busy fraction of all CPUs over the last interval.", kGauge,
        h.cpu_utilization_ratio());
  }
  if (h.cpu_count() > 0) add("cpus", "Number of CPUs.", kGauge, h.cpu_count());
  if (h.has_memory_total_bytes()) {
    add("memory_total_bytes", "Host memory size.", kGauge,
        static_cast<double>(h.memory_total_bytes()));
  }
  if (h.has_memory_available_bytes()) {
    add("memory_available_bytes", "Host memory available (MemAvailable).", kGauge,
        static_cast<double>(h.memory_available_bytes()));
  }
  if (h.has_network_receive_bytes_total()) {
    add("network_receive_bytes_total", "Bytes received on non-loopback interfaces.", kCounter,
        static_cast<double>(h.network_receive_bytes_total()));
  }
  if (h.has_network_transmit_bytes_total()) {
    add("network_transmit_bytes_total", "Bytes sent on non-loopback interfaces.", kCounter,
        static_cast<double>(h.network_transmit_bytes_total()));
  }
  if (h.has_memory_bandwidth_bytes_per_second()) {
    f->Add("stepwatch_agent_host_memory_bandwidth_bytes_per_second",
           "Host memory bandwidth (resctrl or perf uncore counters).", kGauge,
           {{"node", node}, {"source", h.memory_bandwidth_source()}},
           h.memory_bandwidth_bytes_per_second());
  }
}

}  // namespace

std::vector<MetricFamily> AgentCollectable::Collect() const {
  std::vector<MetricFamily> out;
  Families f(&out);
  const std::string& node = sources_.node;
  const std::vector<ClientMetric::Label> nl = {{"node", node}};

  if (sources_.ingest) {
    const IngestStats s = sources_.ingest();
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
    for (const auto& [job, dropped] : s.client_dropped_by_job) {
      f.Add("stepwatch_agent_client_dropped_events_total",
            "Step events that training processes report they failed to send (the \"dropped\" "
            "field), by job; the least recently seen jobs are forgotten beyond a bound.",
            kCounter, {{"node", node}, {"job", job}}, static_cast<double>(dropped));
    }
  }
  if (sources_.shipper) {
    const ShipperStats s = sources_.shipper();
    auto counter = [&](const char* name, const char* help, uint64_t v) {
      f.Add(absl::StrCat("stepwatch_agent_", name), help, kCounter, nl, static_cast<double>(v));
    };
    auto gauge = [&](const char* name, const char* help, double v) {
      f.Add(absl::StrCat("stepwatch_agent_", name), help, kGauge, nl, v);
    };
    counter("events_dropped_total", "Step events dropped because too many were pending.",
            s.events_dropped_total);
    counter("events_shipped_total", "Step events put into batches.", s.events_shipped_total);
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
    counter("rank_exits_total",
            "Ranks reported to the collector as exited (their sender process was gone).",
            s.rank_exits_total);
    gauge("buffer_batches", "Report batches held until the collector acknowledges them.",
          static_cast<double>(s.buffered_batches));
    gauge("buffer_bytes", "Serialized size of the batches held.",
          static_cast<double>(s.buffered_bytes));
    gauge("buffer_capacity_batches", "Most report batches held before the oldest are dropped.",
          static_cast<double>(sources_.buffer_capacity_batches));
    gauge("pending_events", "Step events waiting for the next batch.",
          static_cast<double>(s.pending_events));
    gauge("connected", "1 while a stream to the collector is open.", s.connected ? 1 : 0);
    if (s.spool) {
      gauge("spool_batches", "Report batches in the spool directory.",
            static_cast<double>(s.spool->batches));
      gauge("spool_bytes", "Bytes of report batches in the spool directory.",
            static_cast<double>(s.spool->bytes));
      counter("spool_batches_replayed_total",
              "Batches found in the spool at start (left by an earlier process) and sent again.",
              s.spool->replayed_batches_total);
      counter("spool_batches_dropped_total",
              "Spooled batches deleted unacknowledged because the spool was full.",
              s.spool->dropped_batches_total);
      counter("spool_corrupt_records_total", "Unreadable spool records skipped and deleted.",
              s.spool->corrupt_records_total);
      counter("spool_write_errors_total", "Failed writes to the spool directory.",
              s.spool->write_errors_total);
    }
  }
  if (sources_.samples) {
    const NodeSnapshot snap = sources_.samples();
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
    const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable,
    const std::string& basic_auth_file) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->collectable_ = std::move(collectable);
  security::MetricsEndpointOptions options;
  options.listen = listen;
  options.basic_auth_file = basic_auth_file;
  absl::StatusOr<std::unique_ptr<security::MetricsEndpoint>> endpoint =
      security::MetricsEndpoint::Start(options, server->collectable_);
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
