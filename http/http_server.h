// A small HTTP/1.1 server for /metrics: one event-loop thread over non-blocking sockets (epoll), so
// that idle or slow clients cost a file descriptor and a few hundred bytes each, never a thread.
// Every connection has a deadline in each phase (request head, keep-alive idle, response write)
// and the number of connections is capped; at the cap the oldest connection that has no request
// in progress is closed to make room, so idle connections cannot lock out a scraper. Requests
// are handed to a Handler on the loop thread, which must not block: slow work goes to other
// threads, which answer through the thread-safe HttpResponder.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "http/http_request.h"

namespace stepwatch::http {

struct HttpServerOptions {
  // HOST:PORT; an empty host is 0.0.0.0; port 0 picks a free one.
  std::string listen;
  // Open connections at most; at the cap the oldest idle one is closed for a new one, and a new
  // one is refused when every connection has a request in progress.
  int max_connections = 1024;
  // A request head (request line and header fields) larger than this is answered with 431.
  size_t max_head_bytes = 8192;
  // Time to send a whole request head, from the connection's start or the head's first byte.
  absl::Duration header_timeout = absl::Seconds(5);
  // Time a kept-alive connection may sit without a request.
  absl::Duration idle_timeout = absl::Seconds(30);
  // Time the client has to take a whole response.
  absl::Duration write_timeout = absl::Seconds(10);
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;  // extra header fields
  std::shared_ptr<const std::string> body;                   // nullptr: empty
  // Close the connection after this response even if the client would keep it.
  bool close = false;
};

// Why connections were closed, counted in HttpServerStats.
enum class CloseReason {
  kPeer,           // the client closed it or a socket error
  kDone,           // after a response, no keep-alive
  kHeaderTimeout,  // request head not complete in time
  kIdleTimeout,    // kept alive without a request for too long
  kWriteTimeout,   // the client did not take the response in time
  kEvicted,        // closed at the cap to make room for a new connection
  kCount,
};
const char* CloseReasonName(CloseReason reason);

struct HttpServerStats {
  uint64_t accepted = 0;
  uint64_t refused = 0;  // accepted and closed at once: the cap was reached, nothing to evict
  uint64_t open = 0;
  std::array<uint64_t, static_cast<size_t>(CloseReason::kCount)> closed{};
  std::map<int, uint64_t> responses;  // by status code
};

class HttpServer;

// Answers one request, from any thread, at most once. Answering a connection that is gone, or
// after the server stopped, does nothing.
class HttpResponder {
 public:
  void Send(HttpResponse response) const;

 private:
  friend class HttpServer;
  HttpResponder(HttpServer* server, uint64_t id) : server_(server), id_(id) {}
  HttpServer* server_;
  uint64_t id_;
};

class HttpServer {
 public:
  // Called on the loop thread for every well-formed request head; must not block.
  using Handler = std::function<void(const HttpRequest&, HttpResponder)>;

  // Binds and starts the loop. InvalidArgument for a bad address, Unavailable when it cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           Handler handler);
  // Stop(), then frees the server. Nothing may call HttpResponder::Send from now on.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Stops the loop, joins its thread and closes every connection. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mailbox_mu_);

  int port() const { return port_; }
  HttpServerStats stats() const ABSL_LOCKS_EXCLUDED(responses_mu_);

 private:
  using Clock = std::chrono::steady_clock;
  struct Connection;

  HttpServer(const HttpServerOptions& options, Handler handler);
  void Post(uint64_t id, HttpResponse response) ABSL_LOCKS_EXCLUDED(mailbox_mu_);
  void Loop();
  void Accept();
  bool EvictOldestIdle();
  void OnReadable(Connection* c);
  void ProcessInput(Connection* c);
  void StartResponse(Connection* c, HttpResponse response);
  void OnWritable(Connection* c);
  void DrainMailbox() ABSL_LOCKS_EXCLUDED(mailbox_mu_);
  void Sweep(Clock::time_point now);
  void SetEvents(Connection* c, uint32_t events);
  void Close(Connection* c, CloseReason reason);
  void CountResponse(int status) ABSL_LOCKS_EXCLUDED(responses_mu_);

  friend class HttpResponder;

  const HttpServerOptions options_;
  // options_' timeouts, as the loop adds them to Clock times.
  const Clock::duration header_timeout_, idle_timeout_, write_timeout_;
  const Handler handler_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  bool accept_paused_ = false;
  Clock::time_point accept_resume_{};
  uint64_t next_id_ = 16;  // ids below are the listener's and the wake-up's
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;

  absl::Mutex mailbox_mu_;
  std::vector<std::pair<uint64_t, HttpResponse>> mailbox_ ABSL_GUARDED_BY(mailbox_mu_);
  bool stopped_ ABSL_GUARDED_BY(mailbox_mu_) = false;

  std::atomic<bool> stop_{false};
  std::thread thread_;

  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> open_{0};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(CloseReason::kCount)> closed_{};
  mutable absl::Mutex responses_mu_;
  std::map<int, uint64_t> responses_ ABSL_GUARDED_BY(responses_mu_);
};

}  // namespace stepwatch::http
