// The HTTP endpoint that serves /metrics, for the collector and the agent. Idle or slow clients
// cannot block it: connections live on one event loop with deadlines and a cap
// (http/http_server.h); rendering runs on its own thread and is shared by concurrent scrapers
// (http/metrics_renderer.h); bcrypt verification for the optional basic auth runs on worker
// threads. No TLS: terminate it in a sidecar in front (docs/security.md).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace stepwatch::http {

struct MetricsEndpointOptions {
  // HOST:PORT; port 0 picks a free one.
  std::string listen;
  // Threads verifying basic-auth passwords (bcrypt, ~0.25 s each); rendering has its own thread.
  int threads = 4;
  // Open connections at most; at the cap the oldest idle connection makes room for a new one.
  int max_connections = 1024;
  // A connection must send a whole request head within this time (from its start or, when kept
  // alive, from the head's first byte).
  absl::Duration header_timeout = absl::Seconds(5);
  // A kept-alive connection without a request is closed after this time.
  absl::Duration idle_timeout = absl::Seconds(30);
  // A client must take a whole response within this time.
  absl::Duration write_timeout = absl::Seconds(10);
  // "USER:BCRYPT_HASH" lines (htpasswd -B, mkpasswd -m bcrypt); re-read when it changes. Empty:
  // no authentication.
  std::string basic_auth_file;
  // More families served with the endpoint's own (e.g. the collector's TLS reload counters);
  // called on the renderer's thread.
  std::function<std::vector<prometheus::MetricFamily>()> extra_families;
};

class BasicAuthUsers;
class HttpServer;
class MetricsRenderer;
class WorkerPool;

class MetricsEndpoint {
 public:
  // Binds and starts serving `collectable` at /metrics, with the endpoint's own
  // stepwatch_metrics_http_* counters. InvalidArgument for unreadable files or a bad address,
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const MetricsEndpointOptions& options, std::weak_ptr<prometheus::Collectable> collectable);
  // Closes every connection and joins every thread.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  class Impl;
  MetricsEndpoint() = default;

  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace stepwatch::http
