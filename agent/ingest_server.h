// The agent's local ingest: a Unix datagram socket that training processes send step events to.
// Never blocks a sender (datagrams; a full receive buffer makes the sender's non-blocking send
// fail, not wait), never crashes on bad input: rejected datagrams are counted by reason and logged
// at a bounded rate.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "agent/rank_owners.h"
#include "agent/step_event_parser.h"
#include "common/clock.h"
#include "common/log.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

struct IngestServerOptions {
  std::string socket_path = "/run/stepwatch/agent.sock";
  // Mode of the socket file. 0660: only the agent's user and `socket_group` may send; 0666 lets
  // any local user send (and forge steps of jobs that are not theirs).
  mode_t socket_mode = 0660;
  // Group of the socket file (training users belong to it); -1 keeps the agent's own group.
  gid_t socket_group = static_cast<gid_t>(-1);
  // Bounds the (job, rank) -> sender pid bindings that refuse forged events.
  RankOwnersOptions owners;
  // Mode of the parent directory when it has to be created.
  mode_t directory_mode = 0755;
  // Requested SO_RCVBUF; the kernel caps it at net.core.rmem_max unless SO_RCVBUFFORCE is allowed.
  int receive_buffer_bytes = 16 << 20;
  // How many datagrams one recvmmsg call takes at most.
  int receive_batch = 32;
  // Clock for received_unix_nanos; nullptr means the system clock.
  const Clock* clock = nullptr;
};

struct IngestStats {
  uint64_t datagrams_total = 0;
  uint64_t events_accepted_total = 0;
  std::array<uint64_t, kRejectReasonCount> rejected_total{};
  // recv errors other than "nothing to read".
  uint64_t receive_errors_total = 0;
};

class IngestServer {
 public:
  // Receives every valid event, on the receive thread; must be quick and must not block.
  using Sink = std::function<void(v1::StepEvent&& event)>;

  // Binds the socket (creating the parent directory and replacing a stale socket file) and starts
  // the receive thread. Fails when the path is taken by a live socket or by something else.
  static absl::StatusOr<std::unique_ptr<IngestServer>> Start(const IngestServerOptions& options,
                                                             Sink sink);

  ~IngestServer();
  IngestServer(const IngestServer&) = delete;
  IngestServer& operator=(const IngestServer&) = delete;

  // Stops the receive thread and removes the socket file. Idempotent.
  void Stop();

  const std::string& socket_path() const { return options_.socket_path; }
  // The receive buffer the kernel granted (getsockopt reports twice the usable size).
  int receive_buffer_bytes() const { return granted_rcvbuf_; }
  IngestStats stats() const;

 private:
  IngestServer(const IngestServerOptions& options, Sink sink, int fd, int wake_fd);
  void Run();
  void Handle(const char* data, size_t size, bool truncated, pid_t pid);

  const IngestServerOptions options_;
  const Sink sink_;
  const SystemClock system_clock_;
  const Clock* clock_;
  int fd_ = -1;
  int wake_fd_ = -1;
  int granted_rcvbuf_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  LogRateLimiter reject_log_limiter_;
  RankOwners owners_;  // receive thread only

  std::atomic<uint64_t> datagrams_{0};
  std::atomic<uint64_t> accepted_{0};
  std::array<std::atomic<uint64_t>, kRejectReasonCount> rejected_{};
  std::atomic<uint64_t> receive_errors_{0};
};

}  // namespace stepwatch::agent
