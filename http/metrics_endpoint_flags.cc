#include "http/metrics_endpoint_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT serving Prometheus /metrics (\":PORT\" for all interfaces; port 0 picks a "
          "free port). Empty: no metrics endpoint.");
ABSL_FLAG(std::string, metrics_basic_auth_file, "",
          "File of \"USER:BCRYPT_HASH\" lines (htpasswd -nB USER): /metrics asks for HTTP basic "
          "auth. Re-read when it changes. Empty: no authentication. For TLS, put a terminating "
          "proxy in front (docs/security.md).");
ABSL_FLAG(int32_t, metrics_threads, 4,
          "Threads verifying /metrics basic-auth passwords (bcrypt). Connections are served by "
          "one event loop and rendering has its own thread, so idle or slow clients hold no "
          "thread.");
ABSL_FLAG(int32_t, metrics_max_connections, 1024,
          "Open /metrics connections at most; at the cap the oldest one without a request in "
          "progress is closed to make room (stepwatch_metrics_http_connections_closed_total).");

namespace stepwatch::http {

absl::Status CheckMetricsEndpointFlags() {
  if (absl::GetFlag(FLAGS_metrics_threads) < 1) {
    return absl::InvalidArgumentError("--metrics-threads must be positive");
  }
  if (absl::GetFlag(FLAGS_metrics_max_connections) < 1) {
    return absl::InvalidArgumentError("--metrics-max-connections must be positive");
  }
  return absl::OkStatus();
}

MetricsEndpointOptions MetricsEndpointOptionsFromFlags() {
  MetricsEndpointOptions options;
  options.listen = absl::GetFlag(FLAGS_metrics_listen);
  options.basic_auth_file = absl::GetFlag(FLAGS_metrics_basic_auth_file);
  options.threads = absl::GetFlag(FLAGS_metrics_threads);
  options.max_connections = absl::GetFlag(FLAGS_metrics_max_connections);
  return options;
}

}  // namespace stepwatch::http
