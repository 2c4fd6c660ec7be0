// The running collector: gRPC server (Ingest, Query, health), /metrics endpoint, and an owned
// ticker thread that advances the engine, expires old jobs and nodes and saves the state file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "collector/metrics.h"
#include "collector/service.h"
#include "collector/state.h"
#include "common/clock.h"
#include "common/net.h"
#include "grpcpp/grpcpp.h"
#include "http/metrics_endpoint.h"
#include "security/authorizer.h"
#include "security/tls_credentials.h"

namespace grpc {
class Server;
}

namespace stepwatch::collector {

struct CollectorServerOptions {
  // HOST:PORT for gRPC; port 0 picks a free port (see grpc_port()).
  std::string grpc_listen = "0.0.0.0:7070";
  // HOST:PORT for /metrics; empty disables it; port 0 picks a free port.
  std::string metrics_listen = "0.0.0.0:9464";
  // Directory for the state file (scaling history); empty keeps nothing across restarts.
  std::string state_dir;
  // How often the engine's time-driven parts and expiry run.
  int64_t tick_nanos = 1'000'000'000;
  // How often the state file is written (it is also written at shutdown).
  int64_t save_interval_nanos = 60'000'000'000;
  // Largest ReportBatch (or request) accepted: an agent's largest batch (16384 steps of 256-byte
  // job names, 64 GPUs) is 6.2 MB, and concurrent big batches cannot size the collector's memory.
  int max_receive_message_bytes = 8 << 20;
  // Largest response: stepwatchctl status at 10,000 nodes of 8 GPUs needs a few MiB
  // (docs/performance.md); stepwatchctl accepts 64 MiB.
  int max_send_message_bytes = 64 << 20;
  // Concurrent streams (calls) per connection; an agent holds one.
  int max_concurrent_streams = 16;
  // Largest header list (metadata) of one call; an agent's is under 1 KiB.
  int max_metadata_bytes = 16 << 10;
  // Memory gRPC may use for its transport buffers across all connections (grpc::ResourceQuota).
  // Decoded batches are not counted in it: what concurrent batches hold is bounded by
  // max_receive_message_bytes per stream (docs/performance.md).
  int64_t grpc_memory_bytes = 64 << 20;
  // TLS for gRPC (plaintext when no certificate is given) and, optionally, client certificates.
  security::ServerTlsConfig tls;
  // With client certificates, a batch's node must be the certificate's identity. Off only where
  // agents share one certificate.
  bool verify_node_identity = true;
  // Bearer tokens with roles ("ROLE TOKEN" lines); empty: no token is required.
  std::string auth_token_file;
  // /metrics threads, timeout, TLS and basic auth (its `listen` is metrics_listen).
  http::MetricsEndpointOptions metrics_endpoint;
  CollectorStateOptions state;
  MetricsOptions metrics;
};

// The default --max-memory-mib rule: half of the memory limit of the collector's cgroup (v2
// memory.max, v1 memory.limit_in_bytes) or of MemTotal when there is no limit or it is larger,
// clamped to [256 MiB, 16 GiB]. `cgroup_root` and `meminfo` are injected for tests
// ("/sys/fs/cgroup", "/proc/meminfo").
int64_t DefaultMemoryBudgetBytes(const std::string& cgroup_root = "/sys/fs/cgroup",
                                 const std::string& meminfo = "/proc/meminfo");

class CollectorServer {
 public:
  // Loads the state file, binds both listeners and starts serving. `clock` (which must outlive
  // the server) gives the state its time and drives the ticker: with a SimulatedClock the engine
  // ticks and the state file is saved only as the test advances the time.
  static absl::StatusOr<std::unique_ptr<CollectorServer>> Start(CollectorServerOptions options,
                                                                const Clock* clock);
  ~CollectorServer();
  CollectorServer(const CollectorServer&) = delete;
  CollectorServer& operator=(const CollectorServer&) = delete;

  // Stops accepting, gives open streams up to `grace_nanos` to end, stops the ticker and writes
  // the state file. Idempotent.
  void Shutdown(int64_t grace_nanos = 2'000'000'000);

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  CollectorState* state() { return state_.get(); }

  // Writes the state file now (no-op without a state dir).
  absl::Status SaveState();

 private:
  CollectorServer(CollectorServerOptions options, const Clock* clock);
  absl::Status Init();
  // The steps of Init: the state file's scaling history, the services, the gRPC server, /metrics.
  absl::Status LoadScalingHistory();
  absl::Status MakeServices();
  absl::Status StartGrpc(const HostPort& grpc_hp,
                         std::shared_ptr<grpc::ServerCredentials> credentials);
  absl::Status StartMetrics();
  void TickerLoop();
  std::string StatePath() const;

  const CollectorServerOptions options_;
  const Clock* const clock_;
  std::unique_ptr<CollectorState> state_;
  std::unique_ptr<security::Authorizer> authorizer_;
  std::unique_ptr<IngestService> ingest_;
  std::unique_ptr<QueryService> query_;
  // The checked certificate and key gRPC serves (null for plaintext); outlives server_.
  std::shared_ptr<security::CheckedKeyCertPair> tls_identity_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<StateCollectable> collectable_;
  std::unique_ptr<http::MetricsEndpoint> metrics_endpoint_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;

  absl::Mutex ticker_mu_;
  bool stopping_ ABSL_GUARDED_BY(ticker_mu_) = false;
  std::thread ticker_;
  bool started_ = false;
  bool shut_down_ = false;
};

}  // namespace stepwatch::collector
