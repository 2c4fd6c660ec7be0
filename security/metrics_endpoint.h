// The HTTP endpoint that serves /metrics, for the collector and the agent: enough worker threads
// and a request timeout so that idle connections cannot starve scrapes, and optional basic auth
// (bcrypt hashes, as Prometheus' own web configuration uses). No TLS: the HTTP server in Debian's
// prometheus-cpp (civetweb 1.15) crashes on its first HTTPS request with OpenSSL 3, so TLS for
// /metrics is a terminating sidecar's job (docs/security.md).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

namespace prometheus {
class Exposer;
}

namespace stepwatch::security {

struct MetricsEndpointOptions {
  // HOST:PORT; port 0 picks a free one.
  std::string listen;
  // Worker threads: each serves one connection at a time.
  int threads = 8;
  // A connection that sends no complete request for this long is closed.
  int request_timeout_ms = 10000;
  // "USER:BCRYPT_HASH" lines (htpasswd -B, mkpasswd -m bcrypt); re-read when it changes. Empty:
  // no authentication.
  std::string basic_auth_file;
};

class BasicAuthUsers;

class MetricsEndpoint {
 public:
  // Binds and starts serving `collectable` at /metrics. InvalidArgument for unreadable files,
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const MetricsEndpointOptions& options, std::weak_ptr<prometheus::Collectable> collectable);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  std::unique_ptr<BasicAuthUsers> users_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace stepwatch::security
