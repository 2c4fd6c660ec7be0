#include "collector/server.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file.h"
#include "common/log.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "security/tokens.h"

namespace stepwatch::collector {
namespace {

constexpr char kStateFileName[] = "scaling_history";
// How often freed heap memory is returned to the system (malloc_trim).
constexpr absl::Duration kTrimInterval = absl::Seconds(10);

// Says at start, where operators look, who can write to and read from this collector.
void LogSecurityPosture(const CollectorServerOptions& o, bool tokens) {
  if (!security::Enabled(o.tls)) {
    SW_LOG_WARNING << "*** gRPC is PLAINTEXT (no --tls-cert/--tls-key): anyone who can reach "
                   << o.grpc_listen << " can read every finding"
                   << (tokens ? " and sniff the bearer tokens"
                              : ", report forged steps and GPU "
                                "readings, and page people")
                   << ". Use TLS with client certificates outside a trusted test network. ***";
  } else if (o.tls.client_ca_file.empty()) {
    SW_LOG_WARNING << "gRPC over TLS without client certificates (no --tls-client-ca): a batch's "
                      "node name is not verified"
                   << (tokens ? "" : ", and any client may report and query");
  } else if (o.verify_node_identity) {
    SW_LOG_INFO << "gRPC over TLS; clients must present a certificate of " << o.tls.client_ca_file
                << "; a batch's node must match its certificate (first DNS name, else common "
                   "name), and agent certificates that name no node are refused";
  } else {
    SW_LOG_WARNING << "gRPC over TLS; clients must present a certificate of "
                   << o.tls.client_ca_file
                   << ", but --verify-node-identity=false: batches' node names are NOT checked "
                      "against certificates, so any holder of a valid client certificate may "
                      "report for any node (forge its steps, GPU readings and rank exits). Keep "
                      "it on with one certificate per node unless agents share one certificate";
  }
  if (tokens) {
    SW_LOG_INFO << "bearer tokens required (" << o.auth_token_file
                << "): agent tokens may only report, reader tokens may only query";
  }
}

// The first number in a file (cgroup limits; "max" reads as none).
std::optional<int64_t> ReadLimit(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return std::nullopt;
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &v) || v <= 0) return std::nullopt;
  return v;
}

std::optional<int64_t> ReadMemTotal(const std::string& meminfo) {
  absl::StatusOr<std::string> text = ReadFile(meminfo);
  if (!text.ok()) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, "kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) && kib > 0) return kib * 1024;
  }
  return std::nullopt;
}

// Certificate reloads, where an operator sees a rotation that was refused.
std::vector<prometheus::MetricFamily> TlsFamilies(const security::CheckedKeyCertPair& identity) {
  const security::CheckedKeyCertPair::Stats s = identity.stats();
  std::vector<prometheus::MetricFamily> out;
  for (const auto& [name, help, value] :
       {std::tuple<const char*, const char*, uint64_t>{
            "stepwatch_collector_tls_reloads_total",
            "New --tls-cert/--tls-key pairs taken without a restart.", s.reloads},
        std::tuple<const char*, const char*, uint64_t>{
            "stepwatch_collector_tls_reload_errors_total",
            "Contents of --tls-cert/--tls-key refused at a reload (unreadable, or the key is not "
            "the certificate's); the previous pair kept serving.",
            s.reload_errors}}) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = prometheus::MetricType::Counter;
    prometheus::ClientMetric m;
    m.counter.value = static_cast<double>(value);
    f.metric.push_back(m);
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace

int64_t DefaultMemoryBudgetBytes(const std::string& cgroup_root, const std::string& meminfo) {
  constexpr int64_t kFloor = int64_t{256} << 20;
  constexpr int64_t kCeiling = int64_t{16} << 30;
  std::optional<int64_t> memory = ReadMemTotal(meminfo);
  // cgroup v1 reports "no limit" as a huge number: the smaller of the two is what counts.
  for (const char* file : {"/memory.max", "/memory/memory.limit_in_bytes"}) {
    std::optional<int64_t> limit = ReadLimit(cgroup_root + file);
    if (limit.has_value() && (!memory.has_value() || *limit < *memory)) memory = limit;
  }
  if (!memory.has_value()) return kFloor;
  return std::clamp(*memory / 2, kFloor, kCeiling);
}

CollectorServer::CollectorServer(CollectorServerOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

absl::StatusOr<std::unique_ptr<CollectorServer>> CollectorServer::Start(
    CollectorServerOptions options, const Clock* clock) {
  std::unique_ptr<CollectorServer> server(new CollectorServer(std::move(options), clock));
  absl::Status st = server->Init();
  if (!st.ok()) {
    server->Shutdown(0);
    return st;
  }
  return server;
}

std::string CollectorServer::StatePath() const {
  return options_.state_dir.empty() ? "" : absl::StrCat(options_.state_dir, "/", kStateFileName);
}

absl::Status CollectorServer::Init() {
  state_ = std::make_unique<CollectorState>(options_.state, clock_);
  SW_RETURN_IF_ERROR(LoadScalingHistory());
  absl::StatusOr<HostPort> grpc_hp = ParseHostPort(options_.grpc_listen);
  if (!grpc_hp.ok()) return grpc_hp.status();
  absl::StatusOr<security::ServerTls> tls = security::MakeServerCredentials(options_.tls);
  if (!tls.ok()) return tls.status();
  tls_identity_ = std::move(tls->identity);
  SW_RETURN_IF_ERROR(MakeServices());
  SW_RETURN_IF_ERROR(StartGrpc(*grpc_hp, std::move(tls->credentials)));
  SW_RETURN_IF_ERROR(StartMetrics());
  ticker_ = std::thread([this] { TickerLoop(); });
  started_ = true;
  return absl::OkStatus();
}

absl::Status CollectorServer::LoadScalingHistory() {
  if (!options_.state_dir.empty()) {
    absl::StatusOr<std::string> data = ReadFile(StatePath());
    if (data.ok()) {
      absl::Status st = state_->LoadScalingHistory(*data);
      if (!st.ok()) {
        // A damaged history must not keep the collector down; it starts afresh and says so.
        SW_LOG_WARNING << "ignoring state file " << StatePath() << ": " << st;
      } else {
        SW_LOG_INFO << "loaded scaling history from " << StatePath();
      }
    } else if (!absl::IsNotFound(data.status())) {
      return data.status();
    }
  }

  return absl::OkStatus();
}

absl::Status CollectorServer::MakeServices() {
  std::unique_ptr<security::TokenStore> tokens;
  if (!options_.auth_token_file.empty()) {
    absl::StatusOr<std::unique_ptr<security::TokenStore>> opened =
        security::TokenStore::Open(options_.auth_token_file);
    if (!opened.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--auth-token-file=", options_.auth_token_file,
                                                     ": ", opened.status().message()));
    }
    tokens = *std::move(opened);
  }
  LogSecurityPosture(options_, tokens != nullptr);
  authorizer_ = std::make_unique<security::Authorizer>(std::move(tokens));
  ingest_ = std::make_unique<IngestService>(state_.get(), authorizer_.get(),
                                            options_.verify_node_identity,
                                            !options_.tls.client_ca_file.empty());
  query_ = std::make_unique<QueryService>(state_.get(), authorizer_.get());
  return absl::OkStatus();
}

absl::Status CollectorServer::StartGrpc(const HostPort& grpc_hp,
                                        std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(JoinHostPort(grpc_hp), std::move(credentials), &grpc_port_);
  builder.RegisterService(ingest_.get());
  builder.RegisterService(query_.get());
  // Without this a second collector on the same port would silently share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options_.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_send_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams);
  // Header list (metadata) per call, advertised as SETTINGS_MAX_HEADER_LIST_SIZE: a call over it
  // is reset and the connection closed. Agents send under 1 KiB. gRPC 1.51 still buffers one
  // oversized header field whole before checking (docs/security.md, "Header floods").
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, options_.max_metadata_bytes);
  grpc::ResourceQuota quota("stepwatch-collector");
  quota.Resize(static_cast<size_t>(options_.grpc_memory_bytes));
  builder.SetResourceQuota(quota);
  // Agents ping to keep their long-lived stream alive through idle periods; accept pings every
  // 5 s or slower, even without data, instead of answering them with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Our own pings find agents that vanished without closing their stream.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || grpc_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on ", options_.grpc_listen));
  }
  SW_LOG_INFO << "gRPC listening on " << JoinHostPort({grpc_hp.host, grpc_port_})
              << " (Ingest, Query, health)";

  return absl::OkStatus();
}

absl::Status CollectorServer::StartMetrics() {
  if (options_.metrics_listen.empty()) return absl::OkStatus();
  absl::StatusOr<HostPort> metrics_hp = ParseHostPort(options_.metrics_listen);
  if (!metrics_hp.ok()) return metrics_hp.status();
  collectable_ = std::make_shared<StateCollectable>(state_.get(), options_.metrics);
  http::MetricsEndpointOptions endpoint = options_.metrics_endpoint;
  endpoint.listen = options_.metrics_listen;
  if (tls_identity_ != nullptr) {
    endpoint.extra_families = [identity = tls_identity_] { return TlsFamilies(*identity); };
  }
  absl::StatusOr<std::unique_ptr<http::MetricsEndpoint>> started =
      http::MetricsEndpoint::Start(endpoint, collectable_);
  if (!started.ok()) {
    if (absl::IsInvalidArgument(started.status())) return started.status();
    return absl::UnavailableError(absl::StrCat("cannot listen for /metrics on ",
                                               options_.metrics_listen, ": ",
                                               started.status().message()));
  }
  metrics_endpoint_ = *std::move(started);
  metrics_port_ = metrics_endpoint_->port();
  SW_LOG_INFO << "metrics listening on http://" << JoinHostPort({metrics_hp->host, metrics_port_})
              << "/metrics" << (endpoint.basic_auth_file.empty() ? "" : " (basic auth)");
  return absl::OkStatus();
}

void CollectorServer::TickerLoop() {
  const absl::Duration tick = absl::Nanoseconds(options_.tick_nanos);
  const absl::Duration save_interval = absl::Nanoseconds(options_.save_interval_nanos);
  // Scheduled on the monotonic clock: a wall clock stepped back must not hold ticks (and with
  // them publication, expiry and saves) until it catches up.
  const absl::Duration start = clock_->MonotonicNow();
  absl::Duration next_tick = start + tick;
  absl::Duration next_save = start + save_interval;
  absl::Duration next_trim = start + kTrimInterval;
  while (true) {
    {
      absl::MutexLock lock(&ticker_mu_);
      if (clock_->AwaitFor(&ticker_mu_, absl::Condition(&stopping_),
                           next_tick - clock_->MonotonicNow())) {
        return;
      }
    }
    state_->Tick();
    const absl::Duration now = clock_->MonotonicNow();
    // A tick is a fixed delay after the previous one ends, so a slow tick never piles up ticks.
    next_tick = now + tick;
    if (now >= next_save) {
      next_save += save_interval;
      if (next_save <= now) next_save = now + save_interval;
      absl::Status st = SaveState();
      if (!st.ok()) SW_LOG_WARNING << "cannot save state: " << st;
    }
    if (now >= next_trim) {
      next_trim = now + kTrimInterval;
      // Hands freed heap pages back to the system: what a burst (a header flood, big batches)
      // left behind would otherwise stay in RSS for good.
      malloc_trim(0);
    }
  }
}

absl::Status CollectorServer::SaveState() {
  // A collector that never started must not overwrite the file it could not use.
  if (options_.state_dir.empty() || !started_) return absl::OkStatus();
  absl::Status st = WriteFileAtomically(StatePath(), state_->SerializeScalingHistory());
  if (!st.ok()) state_->CountStateSaveError();
  return st;
}

void CollectorServer::Shutdown(int64_t grace_nanos) {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::nanoseconds(grace_nanos));
  }
  {
    absl::MutexLock lock(&ticker_mu_);
    stopping_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
  // Scrapes read the state: stop them before the state can go away (the endpoint's destructor
  // stops its event loop and joins its threads).
  metrics_endpoint_.reset();
  absl::Status st = SaveState();
  if (!st.ok()) {
    SW_LOG_WARNING << "cannot save state at shutdown: " << st;
  } else if (!options_.state_dir.empty()) {
    SW_LOG_INFO << "saved scaling history to " << StatePath();
  }
}

CollectorServer::~CollectorServer() { Shutdown(); }

}  // namespace stepwatch::collector
