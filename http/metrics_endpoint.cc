#include "http/metrics_endpoint.h"

#include <atomic>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "http/http_basic_auth.h"
#include "http/http_request.h"
#include "http/http_server.h"
#include "http/metrics_renderer.h"
#include "http/worker_pool.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"

namespace stepwatch::http {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// Passwords waiting for a bcrypt worker, at most per worker; beyond that a request gets 503.
constexpr size_t kAuthQueuePerThread = 16;

ClientMetric Sample(double value, MetricType type, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

MetricFamily Family(std::string name, std::string help, MetricType type,
                    std::vector<ClientMetric> metrics) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  f.metric = std::move(metrics);
  return f;
}

// The endpoint's own health, on the endpoint (docs/security.md lists these).
std::vector<MetricFamily> EndpointFamilies(const HttpServerStats& s, uint64_t renders,
                                           double last_render_seconds) {
  const MetricType counter = MetricType::Counter;
  const MetricType gauge = MetricType::Gauge;
  std::vector<MetricFamily> out;
  out.push_back(Family("stepwatch_metrics_http_connections_accepted_total",
                       "Connections accepted by the /metrics server.", counter,
                       {Sample(static_cast<double>(s.accepted), counter)}));
  out.push_back(Family("stepwatch_metrics_http_connections_refused_total",
                       "Connections closed at once: the connection cap was reached and every "
                       "connection had a request in progress.",
                       counter, {Sample(static_cast<double>(s.refused), counter)}));
  std::vector<ClientMetric> closed;
  for (size_t i = 0; i < s.closed.size(); ++i) {
    closed.push_back(Sample(static_cast<double>(s.closed[i]), counter,
                            {{"reason", CloseReasonName(static_cast<CloseReason>(i))}}));
  }
  out.push_back(Family("stepwatch_metrics_http_connections_closed_total",
                       "Connections the /metrics server closed, by reason: peer, done, "
                       "header_timeout, idle_timeout, write_timeout, evicted (oldest idle one, "
                       "at the connection cap).",
                       counter, std::move(closed)));
  out.push_back(Family("stepwatch_metrics_http_connections_open",
                       "Connections open to the /metrics server.", gauge,
                       {Sample(static_cast<double>(s.open), gauge)}));
  std::vector<ClientMetric> responses;
  for (const auto& [code, count] : s.responses) {
    responses.push_back(
        Sample(static_cast<double>(count), counter, {{"code", absl::StrCat(code)}}));
  }
  out.push_back(Family("stepwatch_metrics_http_requests_total",
                       "Responses of the /metrics server, by status code.", counter,
                       std::move(responses)));
  out.push_back(Family("stepwatch_metrics_http_renders_total",
                       "Renders of the /metrics body; concurrent scrapes share one.", counter,
                       {Sample(static_cast<double>(renders), counter)}));
  out.push_back(Family("stepwatch_metrics_http_render_seconds",
                       "Duration of the previous render of the /metrics body.", gauge,
                       {Sample(last_render_seconds, gauge)}));
  return out;
}

HttpResponse TextResponse(int status, std::string text) {
  HttpResponse r;
  r.status = status;
  r.body = std::make_shared<const std::string>(std::move(text));
  return r;
}

}  // namespace

class MetricsEndpoint::Impl {
 public:
  Impl(const MetricsEndpointOptions& options, std::weak_ptr<prometheus::Collectable> collectable)
      : options_(options), collectable_(std::move(collectable)) {}

  ~Impl() {
    // Stop taking requests first; then the threads that may still answer one; the server goes last
    // because their answers reach it (and are dropped).
    if (server_ != nullptr) server_->Stop();
    auth_pool_.reset();
    renderer_.reset();
    server_.reset();
  }

  absl::Status Start(int* port) {
    if (!options_.basic_auth_file.empty()) {
      users_ = std::make_unique<BasicAuthUsers>(options_.basic_auth_file);
      // Both binaries set basic_auth_file from this flag: name it, not just the path.
      if (absl::Status s = users_->Load(); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("--metrics-basic-auth-file: ", s.message()));
      }
      const int threads = std::max(1, options_.threads);
      auth_pool_ = std::make_unique<WorkerPool>(threads, kAuthQueuePerThread * threads);
    }
    renderer_ = std::make_unique<MetricsRenderer>(
        [this](const MetricsRenderer::Stats& stats) { return Collect(stats); });
    HttpServerOptions http;
    http.listen = options_.listen;
    http.max_connections = options_.max_connections;
    constexpr absl::Duration kMinTimeout = absl::Milliseconds(100);
    http.header_timeout = std::max(kMinTimeout, options_.header_timeout);
    http.idle_timeout = std::max(kMinTimeout, options_.idle_timeout);
    http.write_timeout = std::max(kMinTimeout, options_.write_timeout);
    absl::StatusOr<std::unique_ptr<HttpServer>> server =
        HttpServer::Start(http, [this](const HttpRequest& request, HttpResponder responder) {
          Handle(request, responder);
        });
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    stats_source_.store(server_.get());
    *port = server_->port();
    return absl::OkStatus();
  }

 private:
  // On the server's loop thread: only cheap decisions here.
  void Handle(const HttpRequest& request, HttpResponder responder) {
    if (request.method != "GET" && request.method != "HEAD") {
      HttpResponse r = TextResponse(405, "only GET and HEAD\n");
      r.headers.emplace_back("Allow", "GET, HEAD");
      responder.Send(std::move(r));
      return;
    }
    if (request.path != "/metrics") {
      responder.Send(TextResponse(404, "not found; metrics are at /metrics\n"));
      return;
    }
    if (users_ == nullptr) {
      Render(responder);
      return;
    }
    const std::string* authorization = request.Header("authorization");
    if (authorization == nullptr || !ParseBasicAuthorization(*authorization).has_value()) {
      responder.Send(Unauthorized());
      return;
    }
    // A credential verified before is answered here, never queued behind the bcrypt work of a
    // flood of wrong passwords.
    if (users_->VerifyCached(*authorization)) {
      Render(responder);
      return;
    }
    const bool queued = auth_pool_->TrySubmit([this, a = *authorization, responder] {
      if (users_->Verify(a)) {
        Render(responder);
      } else {
        responder.Send(Unauthorized());
      }
    });
    if (!queued) {
      HttpResponse r = TextResponse(503, "too many passwords to verify; retry\n");
      r.headers.emplace_back("Retry-After", "1");
      responder.Send(std::move(r));
    }
  }

  static HttpResponse Unauthorized() {
    HttpResponse r = TextResponse(401, "authentication required\n");
    r.headers.emplace_back("WWW-Authenticate", "Basic realm=\"stepwatch\"");
    return r;
  }

  void Render(HttpResponder responder) {
    renderer_->Request([responder](absl::StatusOr<std::shared_ptr<const std::string>> body) {
      if (!body.ok()) {
        responder.Send(TextResponse(500, std::string(body.status().message()) + "\n"));
        return;
      }
      HttpResponse r;
      r.content_type = kContentType;
      r.body = *std::move(body);
      responder.Send(std::move(r));
    });
  }

  // On the renderer's thread.
  std::vector<MetricFamily> Collect(const MetricsRenderer::Stats& render_stats) {
    std::vector<MetricFamily> families;
    if (std::shared_ptr<prometheus::Collectable> c = collectable_.lock(); c != nullptr) {
      families = c->Collect();
    }
    // A request can arrive before Start() has stored the server.
    const HttpServer* server = stats_source_.load();
    for (MetricFamily& f :
         EndpointFamilies(server == nullptr ? HttpServerStats() : server->stats(),
                          render_stats.renders, render_stats.last_render_seconds)) {
      families.push_back(std::move(f));
    }
    if (users_ != nullptr) {
      const BasicAuthUsers::Stats a = users_->stats();
      std::vector<ClientMetric> checks;
      for (const auto& [result, value] : {std::pair<const char*, uint64_t>{"cached", a.cached},
                                          {"verified", a.verified},
                                          {"refused", a.refused}}) {
        checks.push_back(
            Sample(static_cast<double>(value), MetricType::Counter, {{"result", result}}));
      }
      families.push_back(Family("stepwatch_metrics_http_auth_checks_total",
                                "Basic-auth credentials checked, by result: cached (verified "
                                "before, no bcrypt), verified and refused (bcrypt ran, or an "
                                "unknown user).",
                                MetricType::Counter, std::move(checks)));
    }
    if (options_.extra_families) {
      for (MetricFamily& f : options_.extra_families()) families.push_back(std::move(f));
    }
    return families;
  }

  const MetricsEndpointOptions options_;
  const std::weak_ptr<prometheus::Collectable> collectable_;
  std::unique_ptr<BasicAuthUsers> users_;
  std::unique_ptr<WorkerPool> auth_pool_;
  std::unique_ptr<MetricsRenderer> renderer_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<const HttpServer*> stats_source_{nullptr};  // server_, for the renderer's thread
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const MetricsEndpointOptions& options, std::weak_ptr<prometheus::Collectable> collectable) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->impl_ = std::make_unique<Impl>(options, std::move(collectable));
  if (absl::Status s = endpoint->impl_->Start(&endpoint->port_); !s.ok()) return s;
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace stepwatch::http
