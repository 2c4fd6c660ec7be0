// The agent's own /metrics: the node's raw GPU and host readings (as dcgm-exporter and
// node_exporter would show them) and the agent's health. Built at scrape time from snapshots, so
// nothing here is updated on the hot path.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/collector_link.h"
#include "agent/collector_router.h"
#include "agent/ingest_server.h"
#include "agent/node_reading.h"
#include "http/metrics_endpoint.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "security/tls_credentials.h"

namespace stepwatch::agent {

struct AgentMetricsSources {
  // Value of the `node` label on every series.
  std::string node;
  // Capacity of a link's buffer, in batches.
  uint64_t buffer_capacity_batches = 0;
  std::function<IngestStats()> ingest;
  // One collector's link (tests), or
  std::function<CollectorLinkStats()> link;
  // every collector's: the totals under the families of `link`, plus per-collector families
  // (label `collector`) and the router's own counters. Used instead of `link` when set.
  std::function<CollectorRouterStats()> collectors;
  std::function<NodeReading()> samples;
  // The client certificate's reloads; unset without --tls-cert.
  std::function<security::CheckedKeyCertPair::Stats()> tls;
};

class AgentCollectable : public prometheus::Collectable {
 public:
  explicit AgentCollectable(AgentMetricsSources sources) : sources_(std::move(sources)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const AgentMetricsSources sources_;
};

// Serves /metrics on `listen` (HOST:PORT, ":PORT" for all interfaces, port 0 for any free port),
// behind basic auth when `basic_auth_file` is set (http/metrics_endpoint.h).
class MetricsServer {
 public:
  // `options.listen` is the HOST:PORT to serve on.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const http::MetricsEndpointOptions& options,
      std::shared_ptr<prometheus::Collectable> collectable);
  ~MetricsServer();
  // The bound port (useful with port 0).
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Collectable> collectable_;
  std::unique_ptr<http::MetricsEndpoint> endpoint_;
  int port_ = 0;
};

}  // namespace stepwatch::agent
