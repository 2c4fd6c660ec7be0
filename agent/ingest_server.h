// The agent's local ingest: a Unix datagram socket that training processes send step events to,
// and beside it a Unix SOCK_SEQPACKET socket carrying the same messages (one JSON object per
// packet) over a connection per client. The kernel queues at most net.unix.max_dgram_qlen
// datagrams on the datagram socket (10 by default), so a burst of ranks finishing a step together
// overflows it; a connection's queue is bounded by the sender's buffer bytes instead. Never blocks
// a sender (a full queue makes the sender's non-blocking send fail, not wait), never crashes on
// bad input: rejected messages are counted by reason and logged at a bounded rate.
#pragma once

#include <sys/types.h>
#include <sys/un.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/rank_owners.h"
#include "agent/step_event_parser.h"
#include "common/clock.h"
#include "common/log.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

struct IngestServerOptions {
  std::string socket_path = "/run/stepwatch/agent.sock";
  // The SOCK_SEQPACKET socket (same mode, group and sender checks); empty: none. Clients look for
  // SeqpacketPathFor(socket_path).
  std::string seqpacket_path;
  // Most open seqpacket connections; further ones are accepted and closed at once, and counted.
  int max_connections = 512;
  // Most jobs whose client-reported drops are kept apart; beyond it the least recently seen job
  // is forgotten (its series disappears).
  size_t max_drop_jobs = 256;
  // Mode of the socket file. 0660: only the agent's user and `socket_group` may send; 0666 lets
  // any local user send (and forge steps of jobs that are not theirs).
  mode_t socket_mode = 0660;
  // Group of the socket file (training users belong to it); -1 keeps the agent's own group.
  gid_t socket_group = static_cast<gid_t>(-1);
  // Bounds the (job, rank) -> sender pid bindings that refuse forged events, in all, per process
  // and per user.
  RankOwnersOptions owners;
  // Most users whose refusals for tenant_limit are counted apart (a `uid` label); the others are
  // counted under uid="other".
  size_t max_refused_users = 32;
  // /proc/self/status, read at start to tell whether the agent has a pid namespace of its own.
  std::string proc_self_status = "/proc/self/status";
  // Mode of the parent directory when it has to be created.
  mode_t directory_mode = 0755;
  // Requested SO_RCVBUF; the kernel caps it at net.core.rmem_max unless SO_RCVBUFFORCE is allowed.
  int receive_buffer_bytes = 16 << 20;
  // How many datagrams one recvmmsg call takes at most.
  int receive_batch = 32;
  // Clock for received_unix_nanos; nullptr means the system clock.
  const Clock* clock = nullptr;
};

// Where clients look for the seqpacket socket of the agent at `socket_path`; empty when that path
// would not fit in a socket address (clients then use datagrams only).
inline std::string SeqpacketPathFor(const std::string& socket_path) {
  std::string path = socket_path + ".seq";
  return path.size() < sizeof(sockaddr_un{}.sun_path) ? path : std::string();
}

struct IngestStats {
  // Messages read from the datagram socket, and from seqpacket connections.
  uint64_t datagrams_total = 0;
  uint64_t seqpacket_messages_total = 0;
  uint64_t events_accepted_total = 0;
  std::array<uint64_t, kRejectReasonCount> rejected_total{};
  // recv errors other than "nothing to read".
  uint64_t receive_errors_total = 0;
  uint64_t connections_accepted_total = 0;
  // Connections closed at once because max_connections were open.
  uint64_t connections_refused_total = 0;
  uint64_t connections_open = 0;
  // Per job: events the clients reported they failed to send (the "dropped" field), by job name.
  std::vector<std::pair<std::string, uint64_t>> client_dropped_by_job;
  // Events refused for tenant_limit, by the sender's uid ("other" past max_refused_users).
  std::vector<std::pair<std::string, uint64_t>> tenant_refusals_by_uid;
  // Accepted events whose sender's pid the kernel could not tell (0: a process in another pid
  // namespace): no rank ownership, per-process bound or exit tracking applies to them.
  uint64_t unknown_sender_events_total = 0;
  // The agent runs in a pid namespace of its own (PidNamespaceNested).
  bool own_pid_namespace = false;
};

// Whether the process whose /proc/<pid>/status text is `status` runs in a pid namespace below the
// initial one: its "NSpid:" line lists more than one pid. A sender outside that namespace is seen
// with pid 0 (SO_PEERCRED, SCM_CREDENTIALS). nullopt when the line is absent (kernel < 4.1).
std::optional<bool> PidNamespaceNested(absl::string_view status);

class IngestServer {
 public:
  // Receives every valid event, on the receive thread; must be quick and must not block.
  using Sink = std::function<void(v1::StepEvent&& event)>;

  // Binds the sockets (creating the parent directory and replacing stale socket files) and starts
  // the receive thread. Fails when a path is taken by a live socket or by something else.
  static absl::StatusOr<std::unique_ptr<IngestServer>> Start(const IngestServerOptions& options,
                                                             Sink sink);

  ~IngestServer();
  IngestServer(const IngestServer&) = delete;
  IngestServer& operator=(const IngestServer&) = delete;

  // Stops the receive thread, closes the connections and removes the socket files. Idempotent.
  void Stop();

  const std::string& socket_path() const { return options_.socket_path; }
  // Empty when there is no seqpacket socket.
  const std::string& seqpacket_path() const { return options_.seqpacket_path; }
  // The receive buffer the kernel granted (getsockopt reports twice the usable size).
  int receive_buffer_bytes() const { return granted_rcvbuf_; }
  IngestStats stats() const ABSL_LOCKS_EXCLUDED(drops_mu_);

 private:
  enum class Transport { kDatagram, kSeqpacket };
  // The sender of a message, as the kernel tells it.
  struct Peer {
    pid_t pid = 0;
    uid_t uid = RankOwners::kUnknownUid;
  };
  struct Fds {
    int datagram = -1;
    int seqpacket = -1;  // listening
    int wake = -1;
    int epoll = -1;
  };

  IngestServer(const IngestServerOptions& options, Sink sink, Fds fds);
  void Run();
  // Receive buffers of the receive thread (ingest_server.cc).
  struct Buffers;
  void DrainDatagrams(Buffers* b);
  void Accept();
  // Reads what a connection has queued; false when it is closed (EOF or error).
  bool DrainConnection(int fd, Peer peer, char* buffer);
  void CloseConnection(int fd);
  void Handle(const char* data, size_t size, bool truncated, Peer peer, Transport transport);
  // Counts a tenant_limit refusal under the sender's uid; logs the first one of each user.
  void CountTenantRefusal(Peer peer, RankOwners::Verdict verdict) ABSL_LOCKS_EXCLUDED(tenant_mu_);
  void CountClientDrops(const std::string& job, uint64_t dropped) ABSL_LOCKS_EXCLUDED(drops_mu_);

  const IngestServerOptions options_;
  const Sink sink_;
  const SystemClock system_clock_;
  const Clock* clock_;
  Fds fds_;
  // Open connections -> the peer (SO_PEERCRED); receive thread only.
  absl::flat_hash_map<int, Peer> connections_;
  bool own_pid_namespace_ = false;
  int granted_rcvbuf_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  LogRateLimiter reject_log_limiter_;
  RankOwners owners_;  // receive thread only

  std::atomic<uint64_t> datagrams_{0};
  std::atomic<uint64_t> accepted_{0};
  std::array<std::atomic<uint64_t>, kRejectReasonCount> rejected_{};
  std::atomic<uint64_t> receive_errors_{0};
  std::atomic<uint64_t> seqpacket_messages_{0};
  std::atomic<uint64_t> connections_accepted_{0};
  std::atomic<uint64_t> connections_refused_{0};
  std::atomic<uint64_t> connections_open_{0};
  std::atomic<uint64_t> unknown_sender_events_{0};

  mutable absl::Mutex tenant_mu_;
  absl::flat_hash_map<uid_t, uint64_t> tenant_refusals_ ABSL_GUARDED_BY(tenant_mu_);
  uint64_t tenant_refusals_other_ ABSL_GUARDED_BY(tenant_mu_) = 0;

  struct JobDrops {
    uint64_t dropped = 0;
    uint64_t last_seen = 0;  // event sequence number, for forgetting the least recent job
  };
  mutable absl::Mutex drops_mu_;
  absl::flat_hash_map<std::string, JobDrops> drops_by_job_ ABSL_GUARDED_BY(drops_mu_);
  uint64_t drop_sequence_ ABSL_GUARDED_BY(drops_mu_) = 0;
};

}  // namespace stepwatch::agent
