// Ships what the agent saw to ONE collector: every interval one ReportBatch (step events received
// since the last one, GPU samples, a host sample) on ONE long-lived Ingest.Report stream.
// A CollectorLink has no schedule and no sources of its own: its CollectorRouter reads the node
// once per interval for every collector and hands each link its part with Enqueue().
// Unacknowledged batches stay in a bounded buffer and are resent in order after a reconnect, so a
// collector restart loses nothing within the buffer; when the buffer is full the oldest batches
// are dropped and counted. With a Spool every batch is also written to disk before it is first
// sent, and the batches a previous process left there are sent first, under their original ids.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/backoff.h"
#include "agent/peer_strings.h"
#include "agent/rank_exit_tracker.h"
#include "agent/spool.h"
#include "common/clock.h"
#include "common/log.h"
#include "security/tls_errors.h"
#include "security/tokens.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace grpc {
class Channel;
class ClientContext;
class ChannelCredentials;
}  // namespace grpc

namespace stepwatch::agent {

struct CollectorLinkOptions {
  // Collector address, HOST:PORT.
  std::string collector = "127.0.0.1:7070";
  // Stable id of this agent (MakeAgentId); required.
  std::string agent_id;
  // Id of this process; empty means a random one (MakeBootId).
  std::string boot_id;
  // The router's: the node it reads (ReadNode) and sends in every batch; nvml_* and gpu fields
  // are filled in from the GpuSource.
  v1::NodeInfo node_info;
  // Bounds on unacknowledged batches; the oldest are dropped beyond either.
  size_t max_buffered_batches = 600;
  size_t max_buffered_bytes = 64 << 20;
  // The router's: step events waiting for the next cut; more are dropped and counted.
  size_t max_pending_events = 200000;
  // More events than this in one interval are split over several batches, keeping every message
  // well under gRPC's default 4 MiB receive limit.
  size_t max_events_per_batch = 16384;
  BackoffOptions backoff;
  // How long one connection attempt may take.
  absl::Duration connect_timeout = absl::Seconds(5);
  // A stream whose written batches see no acknowledgement for this long is considered stuck and
  // replaced.
  absl::Duration ack_timeout = absl::Seconds(15);
  // HTTP/2 keepalive pings while a stream is open (never without one: servers refuse that).
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // The router's: sender processes of step events are checked every interval; the (job, rank)
  // entries whose process exited go out once in ReportBatch.rank_exits (a finished job, not a
  // stalled one).
  RankExitTrackerOptions rank_exits;
  // Time of batches and step events (TimeNow), and of every wait, measured on its MonotonicNow so
  // that a wall-clock step moves no schedule: the interval, the reconnect backoff, the connect,
  // acknowledgement and flush timeouts. nullptr means the system clock.
  const Clock* clock = nullptr;
  // With TLS, the name the collector's certificate must carry when `collector` is an IP address
  // resolved from a DNS name (dns:///NAME:PORT); empty: the host in `collector`.
  std::string tls_server_name;
  // Channel credentials (security::MakeChannelCredentials); nullptr means plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Bearer token sent on every stream; nullptr sends none.
  std::shared_ptr<security::TokenSource> token;
  // Which TLS flags were given, to name the likely cause of a failed connection in the log.
  security::TlsClientFlags tls_flags;
  // Durable copy of the buffer; nullptr keeps batches in memory only. When set, its boot_id and
  // seqs are used (options.boot_id is ignored) and its batches are sent first. Must outlive the
  // CollectorLink.
  Spool* spool = nullptr;
};

struct CollectorLinkStats {
  // The collector's address and this link's boot_id (empty in the router's totals).
  std::string collector;
  std::string boot_id;
  // Filled in by the router: connected, or down for less than failover_after.
  bool reachable = false;
  // Filled in by the router: given something by the last cut.
  bool owner = false;
  // Filled in by the router: jobs seen recently that this collector holds.
  uint64_t jobs = 0;
  uint64_t batches_created_total = 0;
  // Every write to a stream, first sends and resends alike.
  uint64_t batches_sent_total = 0;
  uint64_t batches_resent_total = 0;
  uint64_t batches_acknowledged_total = 0;
  // Dropped unacknowledged because the buffer was full.
  uint64_t batches_dropped_total = 0;
  uint64_t events_shipped_total = 0;
  // Filled in by the router: dropped before batching because too many were pending.
  uint64_t events_dropped_total = 0;
  uint64_t buffered_batches = 0;
  uint64_t buffered_bytes = 0;
  // Filled in by the router: step events waiting for the next cut.
  uint64_t pending_events = 0;
  bool connected = false;
  uint64_t connect_attempts_total = 0;
  uint64_t connects_total = 0;
  // Filled in by the router: the node's readings that failed.
  uint64_t gpu_sample_errors_total = 0;
  uint64_t host_sample_errors_total = 0;
  // Filled in by the router: (job, rank) entries reported exited (their sender process was gone).
  uint64_t rank_exits_total = 0;
  uint64_t last_seq = 0;
  uint64_t acked_seq = 0;
  // Filled in by the router: NVML and host strings cut to their bound or with bytes replaced, by
  // field (peer_strings.h).
  PeerStringCounts peer_strings_bounded_total{};
  // Filled in when a spool is used.
  std::optional<SpoolStats> spool;
  // With a spool: batches (and their events) held only in memory because they could not be
  // written (a full disk): what a crash of the agent now would lose. Retried on every cut.
  uint64_t unspooled_batches = 0;
  uint64_t unspooled_events = 0;
  // Events put into batches that could not be spooled when cut; batches written on a retry.
  uint64_t events_unspooled_total = 0;
  uint64_t batches_respooled_total = 0;
};

// What one cut carries to one collector: the contents of its batches before seqs are given.
struct CutContents {
  int64_t created_unix_nanos = 0;
  v1::NodeInfo node;
  std::vector<v1::StepEvent> steps;
  std::vector<v1::GpuSample> gpus;
  std::optional<v1::HostSample> host;
  // Ride in the last batch of the cut, after every step.
  std::vector<v1::RankExit> rank_exits;
  // Jobs that moved away from this collector (ReportBatch.released_jobs); in the last batch too.
  std::vector<std::string> released_jobs;
};

// Whether the stream is open, and since when it is (or is not).
struct LinkState {
  bool connected = false;
  // When the stream last opened (connected) or closed, or the Start() time if it never opened,
  // on the clock's MonotonicNow().
  absl::Duration since = -absl::InfiniteDuration();
};

class CollectorLink {
 public:
  explicit CollectorLink(const CollectorLinkOptions& options);
  ~CollectorLink();
  CollectorLink(const CollectorLink&) = delete;
  CollectorLink& operator=(const CollectorLink&) = delete;

  // Starts the stream thread.
  absl::Status Start();

  // Turns one cut into batches (split by max_events_per_batch), gives them seqs, spools them and
  // queues them for the stream: what the router calls every interval. Thread-safe, never blocks
  // on the network.
  void Enqueue(CutContents cut);

  // Stream state, for failover decisions.
  LinkState link_state() const;

  // Waits up to `flush_timeout` for the collector to acknowledge every queued batch, then closes
  // the stream and joins the threads. Idempotent.
  void Stop(absl::Duration flush_timeout = absl::Seconds(2));

  CollectorLinkStats stats() const;
  const std::string& boot_id() const { return boot_id_; }

 private:
  struct Entry {
    uint64_t seq = 0;
    std::shared_ptr<v1::ReportBatch> batch;
    size_t bytes = 0;
    bool sent_before = false;
    // On disk (always true without a spool).
    bool spooled = true;
  };

  void StreamLoop();
  // Runs one stream until it breaks or the link stops. True when the collector acknowledged
  // something on it (the reconnect backoff then starts small again).
  bool RunStream();
  // Writes the buffer's batches on `stream` in order until it breaks, stalls (no acknowledgement
  // for ack_timeout) or the link stops: why it ended, "" when stopping. mu_ is released only
  // around each write.
  std::string WriteUntilBroken(grpc::ClientReaderWriter<v1::ReportBatch, v1::IngestAck>* stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WaitForChannel();
  // gRPC's message for why the channel cannot connect (one call that fails at once while the
  // channel is in TRANSIENT_FAILURE); "" when it is not failing.
  std::string ProbeFailure();
  // Logs the likely cause of a failed attempt when it differs from the last one logged.
  void ExplainFailure(const std::string& grpc_message, std::string* last_cause);
  // The batches of one cut, without seqs: steps split by max_events_per_batch, the samples in
  // the first, the rank exits and released jobs in the last.
  std::vector<std::shared_ptr<v1::ReportBatch>> BuildBatches(CutContents cut) const;
  // Writes freshly cut batches to the spool before anyone may send them; returns how many (a
  // prefix) were written.
  size_t SpoolBatches(const std::vector<std::shared_ptr<v1::ReportBatch>>& batches);
  // Writes up to a bound of the held batches that could not be spooled before (space was freed).
  void RespoolHeld() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cut_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  void OnAck(const v1::IngestAck& ack);
  // Sleeps up to `d` on the clock unless Stop() is called.
  void SleepUnlessStopped(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  // Conditions for the waits on mu_.
  bool Stopping() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; }
  bool FlushedOrDisconnected() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return buffer_.empty() || !stats_.connected;
  }
  // Something for the stream loop: stopping, a broken stream, or a batch this stream has not
  // carried yet.
  bool StreamHasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stop_ || stream_broken_ || (!buffer_.empty() && buffer_.back().seq > written_seq_);
  }

  const CollectorLinkOptions options_;
  const std::string boot_id_;
  const RealClock real_clock_;
  const Clock* const clock_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ingest::Stub> stub_;

  // Serializes Enqueue: seqs reach the buffer (and the spool) in order.
  absl::Mutex cut_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Waits on mu_ go through clock_ (AwaitWithDeadline), so that a SimulatedClock drives them.
  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Entry> buffer_ ABSL_GUARDED_BY(mu_);
  size_t buffered_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Entries of buffer_ with spooled == false.
  size_t unspooled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t acked_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Highest seq written on the current stream; 0 right after (re)connecting.
  uint64_t written_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Set when written batches are waiting for an acknowledgement (MonotonicNow()).
  std::optional<absl::Duration> awaiting_ack_since_ ABSL_GUARDED_BY(mu_);
  bool stream_broken_ ABSL_GUARDED_BY(mu_) = false;
  bool acked_on_stream_ ABSL_GUARDED_BY(mu_) = false;
  // The error message of the last stream's Finish(), "" when it ended cleanly.
  std::string stream_error_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  CollectorLinkStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Duration link_since_ ABSL_GUARDED_BY(mu_) = -absl::InfiniteDuration();

  LogRateLimiter spool_log_{3, std::chrono::seconds(60)};
  LogRateLimiter cause_log_{3, std::chrono::seconds(60)};

  std::thread streamer_;
};

}  // namespace stepwatch::agent
