// Ships the agent's data to several collectors: every interval it samples the GPUs and the host
// once, takes the pending step events, and hands each collector link (a CollectorLink with its own
// stream, acknowledgements, buffer, seqs, boot_id and spool) the part that collector holds:
//   - a job's steps and rank exits go to the first R reachable collectors of
//     RendezvousOrder(job, collectors) (common/collectors.h);
//   - the node's GPU and host samples go to the union of the owners of the jobs that sent steps
//     on this node in the last `recent_job_window` or whose sender processes still run (a hung
//     job), or with no such job to the owners of NodePlacementKey(node).
// A collector is reachable while its stream is open, and for `failover_after` after it closed (or
// after the link started, for one that never connected): short outages only buffer, longer ones
// move the jobs to the next collector in their order, and they move back once it reconnects.
// The collector list is re-resolved every `resolve_interval`; links appear and disappear with it.
//
// Counting each event once per collector: every link numbers its own batches (seq 1, 2, ...)
// under its own boot_id, and a collector dedupes per (agent_id, boot_id, seq)
// (collector/dedupe.h). A link created again for an address that was removed gets a fresh
// boot_id (without a spool) or continues its spool's boot_id above the spool's seq lease, so it
// never reuses a (boot_id, seq) that collector has seen.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/collector_link.h"
#include "agent/cut_plan.h"
#include "agent/node_reading.h"
#include "agent/rank_exit_tracker.h"
#include "agent/spool.h"
#include "common/clock.h"
#include "common/collectors.h"
#include "common/log.h"
#include "gpu/gpu_source.h"
#include "host/host_sampler.h"

namespace stepwatch::agent {

using CollectorResolver = std::function<absl::StatusOr<std::vector<std::string>>()>;

struct CollectorRouterOptions {
  // --collector as parsed; resolved with ResolveCollectorTargets unless `resolve` is set.
  CollectorTargets targets;
  // Returns the collectors now ("IP:PORT" strings); tests inject their own.
  CollectorResolver resolve;
  absl::Duration resolve_interval = absl::Seconds(30);
  // Retry interval while no resolution has succeeded yet.
  absl::Duration initial_resolve_retry = absl::Seconds(1);
  // Collectors holding each job (capped at the number of collectors).
  int replicas = 2;
  absl::Duration failover_after = absl::Seconds(2);
  // Jobs that sent steps this recently take the node's samples along.
  absl::Duration recent_job_window = absl::Seconds(60);
  // Most jobs remembered as recent (see recent_job_window).
  size_t max_recent_jobs = 4096;
  // A removed collector's link waits this long for its last acknowledgements.
  absl::Duration removed_flush_timeout = absl::Seconds(2);
  // The schedule: every interval one cut samples the node and hands every link its part (the
  // links have no schedule of their own).
  absl::Duration interval = absl::Seconds(1);
  // Template of every link: agent_id, node_info, bounds, backoff, timeouts, credentials, token,
  // clock, rank_exits, max_pending_events. `collector`, `boot_id` and `spool` are set per link.
  CollectorLinkOptions link;
  // With a non-empty dir every link spools under dir/LinkSpoolName(address).
  SpoolOptions spool;
};

struct CollectorRouterStats {
  // Counters summed over the links, the removed ones included; router-level values (pending and
  // dropped events, sample errors, rank exits) from the router. `connected`: every collector the
  // last cut needed is connected (nothing is only buffered).
  CollectorLinkStats total;
  std::vector<CollectorLinkStats> links;
  uint64_t links_added_total = 0;
  uint64_t links_removed_total = 0;
  uint64_t resolve_errors_total = 0;
  // Times a job's owners changed (failover, return, list change).
  uint64_t job_moves_total = 0;
  // Cuts whose steps had no collector to go to (the list never resolved): the steps stay pending.
  uint64_t cuts_without_collectors_total = 0;
  // Links running without the configured spool (it was on a full disk at their start).
  uint64_t links_without_spool = 0;
};

// "collector-" + the address with every character but [A-Za-z0-9.-] replaced by '_'.
std::string LinkSpoolName(const std::string& address);

class CollectorRouter {
 public:
  // `gpus` and `host` may be nullptr; they must outlive the router.
  CollectorRouter(CollectorRouterOptions options, gpu::GpuSource* gpus, host::HostSampler* host);
  ~CollectorRouter();
  CollectorRouter(const CollectorRouter&) = delete;
  CollectorRouter& operator=(const CollectorRouter&) = delete;

  // Resolves the list once (a failure is logged and retried), starts the links, the ticker and
  // the resolver.
  absl::Status Start();
  // Thread-safe; never blocks on the network.
  void AddStep(v1::StepEvent&& event);
  // Cuts now, outside the schedule (tests and shutdown).
  void FlushNow();
  // Resolves the list now and adds/removes links (tests; the resolver thread does it on its own).
  void ResolveNow() { (void)Resolve(/*at_start=*/false); }
  // Cuts the pending steps, then stops every link in parallel, each waiting up to `flush_timeout`
  // for its acknowledgements. Idempotent.
  void Stop(absl::Duration flush_timeout = absl::Seconds(2));

  // The collectors that would hold `job` now.
  std::vector<std::string> OwnersOf(const std::string& job) const;
  std::vector<std::string> collectors() const;
  CollectorRouterStats stats() const;
  // The node as the last cut with samples read it (the NodeInfo alone before that).
  NodeReading LatestSamples() const;

 private:
  struct Link {
    std::string address;
    // Destroyed after the link that writes to it.
    std::unique_ptr<Spool> spool;
    std::unique_ptr<CollectorLink> impl;
    // A spool was configured but could not be opened (full disk): memory only.
    bool no_spool = false;
  };
  using Links = std::map<std::string, std::shared_ptr<Link>>;

  void TickerLoop();
  void ResolverLoop();
  void Cut(bool with_samples);
  // At start a spool that cannot be opened is an error; later it is logged and the link holds
  // its batches in memory only.
  absl::Status Resolve(bool at_start);
  absl::StatusOr<std::shared_ptr<Link>> MakeLink(const std::string& address, bool at_start);
  absl::Status LockSpoolRoot();
  void StopLinks(const std::vector<std::shared_ptr<Link>>& links, absl::Duration flush_timeout);
  // The links reachable now; all of them when none is (their buffers then hold the data).
  std::vector<std::string> Candidates(const Links& links) const;
  // `now`: the clock's MonotonicNow().
  bool Reachable(const Link& link, absl::Duration now) const;
  void AddRemovedTotals(const CollectorLinkStats& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberJob(const std::string& job, absl::Duration now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Remembers the jobs of `cut` (and those with live senders) and forgets the expired ones.
  void TrackRecentJobs(const CutContents& cut, bool with_samples, absl::Duration now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogMoves(const std::vector<JobMove>& moves);
  bool Stopping() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; }

  const CollectorRouterOptions options_;
  const int replicas_;
  gpu::GpuSource* const gpus_;
  host::HostSampler* const host_;
  const RealClock real_clock_;
  const Clock* const clock_;
  RankExitTracker exits_;
  // flock on spool.dir/lock while the router lives: one agent per --spool-dir.
  int spool_lock_fd_ = -1;

  // Serializes cuts: the sources need not be thread-safe, and links get cuts in order.
  absl::Mutex cut_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Serializes resolutions (resolver thread, ResolveNow).
  absl::Mutex resolve_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool resolved_once_ ABSL_GUARDED_BY(mu_) = false;
  Links links_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StepEvent> pending_ ABSL_GUARDED_BY(mu_);
  // Job -> when it last sent a step (or exit) here, on the monotonic clock; older than
  // recent_job_window are forgotten.
  absl::flat_hash_map<std::string, absl::Duration> recent_jobs_ ABSL_GUARDED_BY(mu_);
  // Job -> the collectors that held it at the last cut (to log and count moves).
  absl::flat_hash_map<std::string, std::vector<std::string>> job_owners_ ABSL_GUARDED_BY(mu_);
  // The collectors the last cut gave something to.
  std::set<std::string> needed_ ABSL_GUARDED_BY(mu_);
  bool cut_once_ ABSL_GUARDED_BY(mu_) = false;
  // Counters of removed links, so that the totals never go down.
  CollectorLinkStats removed_totals_ ABSL_GUARDED_BY(mu_);
  CollectorRouterStats counters_ ABSL_GUARDED_BY(mu_);
  CollectorLinkStats router_stats_ ABSL_GUARDED_BY(mu_);

  LogRateLimiter move_log_{10, std::chrono::seconds(60)};
  LogRateLimiter resolve_log_{3, std::chrono::seconds(300)};

  mutable absl::Mutex sample_mu_;
  NodeReading latest_ ABSL_GUARDED_BY(sample_mu_);

  std::thread ticker_;
  std::thread resolver_;
};

}  // namespace stepwatch::agent
