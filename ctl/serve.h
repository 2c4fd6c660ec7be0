// `stepwatchctl serve`: a read-only live view of the collectors in a browser. The job list (Status
// and Findings of every collector, merged) at "/", each job's report at "/jobs/<job>" (Report from
// its owners, merged), both reloading themselves. Served by the project's HTTP server
// (http/http_server.h); the collectors are asked from worker threads, never on its loop. There is
// no authentication: it listens on loopback unless told otherwise.
#pragma once

#include <signal.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ctl/fanout.h"
#include "ctl/serve_pages.h"
#include "grpcpp/grpcpp.h"

namespace stepwatch::ctl {

// The collectors to ask, as stepwatchctl's other commands ask them.
struct ServeCollectors {
  // In flag order, or the sorted addresses of a DNS name (ResolveCollectorTargets).
  std::vector<std::string> collectors;
  // How many of a job's owners to ask (EffectiveReplicas).
  int replicas = 1;
  const CollectorClients* clients = nullptr;
  // Why a collector gave no answer, in words naming it and what to check.
  std::function<std::string(const std::string& collector, const grpc::Status& status)>
      describe_failure;
};

struct ServeOptions {
  std::string listen = kDefaultServeListen;   // HOST:PORT; port 0 picks a free one
  absl::Duration refresh = absl::Seconds(5);  // the pages reload this often; zero: never
  // Threads asking the collectors, and requests waiting for one at most (then 503).
  int threads = 4;
  size_t max_queued = 64;
};

class LiveView {
 public:
  // Binds and starts serving. InvalidArgument for a bad address, Unavailable when it cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<LiveView>> Start(const ServeOptions& options,
                                                         ServeCollectors collectors);
  // Stops taking requests, joins the worker threads (each after its current request) and the
  // server's loop.
  ~LiveView();
  LiveView(const LiveView&) = delete;
  LiveView& operator=(const LiveView&) = delete;

  int port() const;

 private:
  class Impl;
  explicit LiveView(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Starts a LiveView, logs where it serves ("serving on http://HOST:PORT/", and a warning when that
// is not loopback), and waits for one of `stop_signals` (blocked in every thread by the caller,
// before any thread was started); then stops it.
absl::Status ServeUntilSignalled(const ServeOptions& options, ServeCollectors collectors,
                                 const sigset_t& stop_signals);

}  // namespace stepwatch::ctl
