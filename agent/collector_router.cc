#include "agent/collector_router.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/cut_plan.h"
#include "agent/peer_strings.h"

namespace stepwatch::agent {
namespace {

void AddCounters(const CollectorLinkStats& s, CollectorLinkStats* sum) {
  sum->events_unspooled_total += s.events_unspooled_total;
  sum->batches_respooled_total += s.batches_respooled_total;
  sum->batches_created_total += s.batches_created_total;
  sum->batches_sent_total += s.batches_sent_total;
  sum->batches_resent_total += s.batches_resent_total;
  sum->batches_acknowledged_total += s.batches_acknowledged_total;
  sum->batches_dropped_total += s.batches_dropped_total;
  sum->events_shipped_total += s.events_shipped_total;
  sum->connect_attempts_total += s.connect_attempts_total;
  sum->connects_total += s.connects_total;
}

std::string JoinOrNone(const std::vector<std::string>& v) {
  return v.empty() ? std::string("(none)") : absl::StrJoin(v, ",");
}

}  // namespace

std::string LinkSpoolName(const std::string& address) {
  std::string out = "collector-";
  for (char c : address) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-';
    out.push_back(safe ? c : '_');
  }
  return out;
}

CollectorRouter::CollectorRouter(CollectorRouterOptions options, gpu::GpuSource* gpus,
                                 host::HostSampler* host)
    : options_(std::move(options)),
      replicas_(std::max(1, options_.replicas)),
      gpus_(gpus),
      host_(host),
      clock_(options_.link.clock ? options_.link.clock : &real_clock_),
      exits_(options_.link.rank_exits) {
  latest_.node = options_.link.node_info;
}

CollectorRouter::~CollectorRouter() {
  Stop(absl::ZeroDuration());
  if (spool_lock_fd_ >= 0) ::close(spool_lock_fd_);
}

absl::Status CollectorRouter::LockSpoolRoot() {
  std::error_code ec;
  std::filesystem::create_directories(options_.spool.dir, ec);
  if (ec) {
    const std::string message =
        absl::StrCat("cannot create spool directory ", options_.spool.dir, ": ", ec.message());
    return ec == std::errc::no_space_on_device ? absl::ResourceExhaustedError(message)
                                               : absl::FailedPreconditionError(message);
  }
  const std::string path = absl::StrCat(options_.spool.dir, "/lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    const std::string message = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(message)
                                          : absl::FailedPreconditionError(message);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("spool directory ", options_.spool.dir, " is in use by another agent"));
  }
  spool_lock_fd_ = fd;
  return absl::OkStatus();
}

absl::Status CollectorRouter::Start() {
  if (options_.link.agent_id.empty()) return absl::InvalidArgumentError("agent_id is required");
  if (options_.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("interval must be > 0");
  }
  if (!options_.resolve && options_.targets.addresses.empty() && !options_.targets.is_dns()) {
    return absl::InvalidArgumentError("no collectors given");
  }
  if (options_.resolve_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("resolve interval must be > 0");
  }
  if (!options_.spool.dir.empty() && spool_lock_fd_ < 0) {
    if (absl::Status st = LockSpoolRoot(); absl::IsResourceExhausted(st)) {
      // A full disk: each link's spool (locked on its own) is tried, and runs from memory if it
      // cannot be had either.
      SW_LOG_ERROR << "--spool-dir " << options_.spool.dir << ": " << st.message();
    } else if (!st.ok()) {
      return st;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("already started");
    started_ = true;
  }
  if (absl::Status st = Resolve(/*at_start=*/true); !st.ok()) {
    std::vector<std::shared_ptr<Link>> opened;
    {
      absl::MutexLock lock(&mu_);
      stop_ = stopped_ = true;
      for (auto& [address, link] : links_) opened.push_back(link);
    }
    StopLinks(opened, absl::ZeroDuration());
    return st;
  }
  ticker_ = std::thread([this] { TickerLoop(); });
  resolver_ = std::thread([this] { ResolverLoop(); });
  return absl::OkStatus();
}

void CollectorRouter::AddStep(v1::StepEvent&& event) {
  exits_.Observe(event.job(), event.rank(), event.pid(),
                 absl::ToInt64Nanoseconds(clock_->MonotonicNow()));
  absl::MutexLock lock(&mu_);
  if (pending_.size() >= options_.link.max_pending_events) {
    ++router_stats_.events_dropped_total;
    return;
  }
  pending_.push_back(std::move(event));
}

void CollectorRouter::FlushNow() { Cut(/*with_samples=*/true); }

absl::StatusOr<std::shared_ptr<CollectorRouter::Link>> CollectorRouter::MakeLink(
    const std::string& address, bool at_start) {
  auto link = std::make_shared<Link>();
  link->address = address;
  CollectorLinkOptions o = options_.link;
  o.collector = address;
  // A link of its own numbers its batches from 1: a boot_id of its own keeps the collector from
  // taking them for ones an earlier link to it already sent (collector/dedupe.h).
  o.boot_id = MakeBootId();
  o.spool = nullptr;
  if (!options_.spool.dir.empty()) {
    SpoolOptions so = options_.spool;
    so.dir = absl::StrCat(options_.spool.dir, "/", LinkSpoolName(address));
    absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(so, o.agent_id);
    if (spool.ok()) {
      link->spool = *std::move(spool);
      o.spool = link->spool.get();
      if (link->spool->stats().boot_rewrites_in_place_total > 0) {
        SW_LOG_WARNING << "--spool-dir " << so.dir
                       << " is on a full disk: started by rewriting its boot file in place; new "
                          "batches are held in memory until space is freed (counted in "
                          "stepwatch_agent_spool_unspooled_batches)";
      }
      const SpoolStats ss = link->spool->stats();
      if (ss.replayed_batches_total > 0) {
        SW_LOG_INFO << "spool " << so.dir << ": " << ss.replayed_batches_total
                    << " batches to replay to " << address;
      }
    } else if (absl::IsResourceExhausted(spool.status())) {
      // A full disk must not take the node's monitoring down: run, loudly, from memory.
      SW_LOG_ERROR << "collector " << address << ": --spool-dir " << so.dir
                   << " is on a full disk and has no boot file yet: running WITHOUT a spool for "
                      "this collector (batches held in memory only, lost if the agent dies); "
                      "free space and restart the agent to spool again ("
                   << spool.status().message() << ")";
      link->no_spool = true;
    } else if (at_start) {
      return spool.status();
    } else {
      SW_LOG_WARNING << "collector " << address << ": no spool (" << spool.status().message()
                     << "); its batches are held in memory only";
    }
  }
  link->impl = std::make_unique<CollectorLink>(o);
  if (absl::Status st = link->impl->Start(); !st.ok()) return st;
  return link;
}

absl::Status CollectorRouter::Resolve(bool at_start) {
  absl::MutexLock resolve_lock(&resolve_mu_);
  absl::StatusOr<std::vector<std::string>> resolved =
      options_.resolve ? options_.resolve() : ResolveCollectorTargets(options_.targets);
  if (resolved.ok() && resolved->empty()) {
    resolved = absl::NotFoundError("the collector list resolved to no address");
  }
  if (!resolved.ok()) {
    size_t kept = 0;
    {
      absl::MutexLock lock(&mu_);
      ++counters_.resolve_errors_total;
      kept = links_.size();
    }
    uint64_t suppressed = 0;
    if (resolve_log_.Allow(&suppressed)) {
      SW_LOG_WARNING << "cannot resolve the collectors: " << resolved.status().message()
                     << "; keeping the last list (" << kept << " collectors)"
                     << (suppressed > 0 ? absl::StrCat(", ", suppressed, " similar suppressed")
                                        : std::string());
    }
    return absl::OkStatus();
  }
  const std::set<std::string> want(resolved->begin(), resolved->end());
  std::vector<std::string> to_add;
  std::vector<std::shared_ptr<Link>> removed;
  {
    absl::MutexLock lock(&mu_);
    resolved_once_ = true;
    if (stop_) return absl::OkStatus();
    for (const std::string& a : want) {
      if (links_.count(a) == 0) to_add.push_back(a);
    }
    for (auto it = links_.begin(); it != links_.end();) {
      if (want.count(it->first) == 0) {
        removed.push_back(it->second);
        it = links_.erase(it);
        ++counters_.links_removed_total;
      } else {
        ++it;
      }
    }
  }
  for (const auto& link : removed) {
    SW_LOG_INFO << "collector " << link->address
                << " left the list: flushing its link, then closing it";
  }
  // Outside mu_: a removed collector's flush must not hold up the ticker.
  StopLinks(removed, options_.removed_flush_timeout);
  for (const std::string& a : to_add) {
    absl::StatusOr<std::shared_ptr<Link>> made = MakeLink(a, at_start);
    if (!made.ok()) {
      if (at_start) return made.status();
      SW_LOG_ERROR << "collector " << a << ": cannot start its link: " << made.status();
      continue;
    }
    std::shared_ptr<Link> link = *std::move(made);
    size_t count = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) {
        // Stop() has already taken the links it stops; this one stops here.
        link->impl->Stop(absl::ZeroDuration());
        return absl::OkStatus();
      }
      links_.emplace(a, link);
      ++counters_.links_added_total;
      count = links_.size();
    }
    SW_LOG_INFO << "collector " << a << " added (" << count << " collectors, boot_id "
                << link->impl->boot_id() << ")";
  }
  return absl::OkStatus();
}

void CollectorRouter::StopLinks(const std::vector<std::shared_ptr<Link>>& links,
                                absl::Duration flush_timeout) {
  std::vector<std::thread> stoppers;
  stoppers.reserve(links.size());
  for (const auto& link : links) {
    stoppers.emplace_back([link, flush_timeout] { link->impl->Stop(flush_timeout); });
  }
  for (std::thread& t : stoppers) t.join();
  absl::MutexLock lock(&mu_);
  for (const auto& link : links) AddRemovedTotals(link->impl->stats());
}

void CollectorRouter::AddRemovedTotals(const CollectorLinkStats& s) {
  AddCounters(s, &removed_totals_);
}

void CollectorRouter::Stop(absl::Duration flush_timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_ = true;
    if (!started_) return;
  }
  if (ticker_.joinable()) ticker_.join();
  if (resolver_.joinable()) resolver_.join();
  bool has_pending = false;
  {
    absl::MutexLock lock(&mu_);
    has_pending = !pending_.empty();
  }
  if (has_pending) Cut(/*with_samples=*/false);
  std::vector<std::shared_ptr<Link>> links;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [address, link] : links_) links.push_back(link);
  }
  StopLinks(links, flush_timeout);
}

void CollectorRouter::TickerLoop() {
  // On the monotonic clock: a wall clock stepped back an hour must not hold the cuts for an hour.
  absl::Duration next = clock_->MonotonicNow() + options_.interval;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (clock_->AwaitFor(&mu_, absl::Condition(this, &CollectorRouter::Stopping),
                           next - clock_->MonotonicNow())) {
        return;
      }
    }
    Cut(/*with_samples=*/true);
    next += options_.interval;
    // After a stall skip missed ticks instead of bursting.
    const absl::Duration now = clock_->MonotonicNow();
    if (next < now) next = now + options_.interval;
  }
}

void CollectorRouter::ResolverLoop() {
  while (true) {
    absl::Duration wait = options_.resolve_interval;
    {
      absl::MutexLock lock(&mu_);
      if (!resolved_once_) wait = std::min(wait, options_.initial_resolve_retry);
      if (clock_->AwaitFor(&mu_, absl::Condition(this, &CollectorRouter::Stopping), wait)) {
        return;
      }
    }
    ResolveNow();
  }
}

bool CollectorRouter::Reachable(const Link& link, absl::Duration now) const {
  const LinkState state = link.impl->link_state();
  return state.connected || now - state.since < options_.failover_after;
}

std::vector<std::string> CollectorRouter::Candidates(const Links& links) const {
  const absl::Duration now = clock_->MonotonicNow();
  std::vector<std::string> all, reachable;
  for (const auto& [address, link] : links) {
    all.push_back(address);
    if (Reachable(*link, now)) reachable.push_back(address);
  }
  return reachable.empty() ? all : reachable;
}

// Bounded: a flood of job names (a local user may send any) is still placed, but beyond the bound
// new jobs neither draw the node's samples nor have their moves logged.
void CollectorRouter::RememberJob(const std::string& job, absl::Duration now) {
  auto it = recent_jobs_.find(job);
  if (it != recent_jobs_.end()) {
    it->second = now;
  } else if (recent_jobs_.size() < options_.max_recent_jobs) {
    recent_jobs_.emplace(job, now);
  }
}

std::vector<std::string> CollectorRouter::OwnersOf(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  return RendezvousOwners(job, Candidates(links_), replicas_);
}

std::vector<std::string> CollectorRouter::collectors() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [address, link] : links_) out.push_back(address);
  return out;
}

// Bounded like RememberJob; a job gone for recent_job_window is forgotten with its owners.
void CollectorRouter::TrackRecentJobs(const CutContents& cut, bool with_samples,
                                      absl::Duration now) {
  for (const v1::StepEvent& e : cut.steps) RememberJob(e.job(), now);
  for (const v1::RankExit& x : cut.rank_exits) RememberJob(x.job(), now);
  // A hung job sends no steps, but its owners still need this node's samples (its GPUs, and
  // the node not reported quiet) while its processes live.
  if (with_samples) {
    for (const std::string& job : exits_.JobsWithLiveSenders()) RememberJob(job, now);
  }
  for (auto it = recent_jobs_.begin(); it != recent_jobs_.end();) {
    if (now - it->second > options_.recent_job_window) {
      job_owners_.erase(it->first);
      recent_jobs_.erase(it++);
    } else {
      ++it;
    }
  }
}

void CollectorRouter::LogMoves(const std::vector<JobMove>& moves) {
  for (const JobMove& m : moves) {
    uint64_t suppressed = 0;
    if (move_log_.Allow(&suppressed)) {
      SW_LOG_INFO << "job " << m.job << " moved from collectors " << JoinOrNone(m.from) << " to "
                  << JoinOrNone(m.to)
                  << (suppressed > 0 ? absl::StrCat(" (", suppressed, " moves not logged)")
                                     : std::string());
    }
  }
}

void CollectorRouter::Cut(bool with_samples) {
  absl::MutexLock cut_lock(&cut_mu_);
  // Timestamps on the wall clock, the recent-job window on the monotonic one.
  const int64_t now = clock_->NowUnixNanos();
  const absl::Duration now_time = clock_->MonotonicNow();
  NodeReading reading = ReadNode(options_.link.node_info, gpus_, host_, now, with_samples);
  if (with_samples) {
    absl::MutexLock lock(&sample_mu_);
    latest_ = reading;
  }

  Links links;
  {
    absl::MutexLock lock(&mu_);
    router_stats_.gpu_sample_errors_total += reading.gpu_errors;
    for (int i = 0; i < kPeerStringFieldCount; ++i) {
      router_stats_.peer_strings_bounded_total[i] += reading.strings_bounded[i];
    }
    router_stats_.host_sample_errors_total += reading.host_errors;
    links = links_;
    if (links.empty()) {
      // Nowhere to go yet: the steps wait (bounded by max_pending_events), exits stay tracked.
      ++counters_.cuts_without_collectors_total;
      return;
    }
  }
  CutContents cut;
  cut.created_unix_nanos = now;
  cut.node = std::move(reading.node);
  cut.gpus = std::move(reading.gpus);
  cut.host = std::move(reading.host);
  // Senders are checked before the steps are taken: a process's steps precede its exit.
  if (with_samples) cut.rank_exits = exits_.Check(absl::ToInt64Nanoseconds(now_time), now);

  CutPlanInput in;
  for (const auto& [address, link] : links) in.links.push_back(address);
  in.candidates = Candidates(links);
  in.replicas = replicas_;
  in.node_key = NodePlacementKey(options_.link.node_info.node());
  in.with_samples = with_samples;
  {
    absl::MutexLock lock(&mu_);
    cut.steps.swap(pending_);
    router_stats_.rank_exits_total += cut.rank_exits.size();
    TrackRecentJobs(cut, with_samples, now_time);
    in.recent_jobs.reserve(recent_jobs_.size());
    for (const auto& [job, seen] : recent_jobs_) in.recent_jobs.push_back(job);
    in.previous_owners = job_owners_;
  }
  CutPlan plan = PlanCut(in, std::move(cut));
  {
    absl::MutexLock lock(&mu_);
    job_owners_ = std::move(plan.owners);
    counters_.job_moves_total += plan.moves.size();
    needed_ = std::move(plan.needed);
    cut_once_ = true;
  }
  LogMoves(plan.moves);
  for (auto& [address, contents] : plan.parts) {
    links.at(address)->impl->Enqueue(std::move(contents));
  }
}

CollectorRouterStats CollectorRouter::stats() const {
  Links links;
  CollectorRouterStats out;
  std::set<std::string> needed;
  bool cut_once = false;
  absl::flat_hash_map<std::string, std::vector<std::string>> job_owners;
  {
    absl::MutexLock lock(&mu_);
    links = links_;
    out = counters_;
    out.total = removed_totals_;
    out.total.events_dropped_total = router_stats_.events_dropped_total;
    out.total.gpu_sample_errors_total = router_stats_.gpu_sample_errors_total;
    out.total.peer_strings_bounded_total = router_stats_.peer_strings_bounded_total;
    out.total.host_sample_errors_total = router_stats_.host_sample_errors_total;
    out.total.rank_exits_total = router_stats_.rank_exits_total;
    out.total.pending_events = pending_.size();
    needed = needed_;
    cut_once = cut_once_;
    job_owners = job_owners_;
  }
  const absl::Duration now = clock_->MonotonicNow();
  bool all_needed_connected = !links.empty();
  for (const auto& [address, link] : links) {
    CollectorLinkStats l = link->impl->stats();
    if (link->no_spool) ++out.links_without_spool;
    l.reachable = Reachable(*link, now);
    l.owner = cut_once ? needed.count(address) > 0 : true;
    for (const auto& [job, o] : job_owners) {
      if (std::find(o.begin(), o.end(), address) != o.end()) ++l.jobs;
    }
    if (l.owner && !l.connected) all_needed_connected = false;
    AddCounters(l, &out.total);
    out.total.buffered_batches += l.buffered_batches;
    out.total.buffered_bytes += l.buffered_bytes;
    out.total.unspooled_batches += l.unspooled_batches;
    out.total.unspooled_events += l.unspooled_events;
    out.total.last_seq = std::max(out.total.last_seq, l.last_seq);
    if (l.spool) {
      if (!out.total.spool) out.total.spool = SpoolStats{};
      SpoolStats& s = *out.total.spool;
      s.batches += l.spool->batches;
      s.bytes += l.spool->bytes;
      s.replayed_batches_total += l.spool->replayed_batches_total;
      s.corrupt_records_total += l.spool->corrupt_records_total;
      s.dropped_batches_total += l.spool->dropped_batches_total;
      s.write_errors_total += l.spool->write_errors_total;
      s.boot_rewrites_in_place_total += l.spool->boot_rewrites_in_place_total;
    }
    out.links.push_back(std::move(l));
  }
  out.total.connected = all_needed_connected;
  return out;
}

NodeReading CollectorRouter::LatestSamples() const {
  absl::MutexLock lock(&sample_mu_);
  return latest_;
}

}  // namespace stepwatch::agent
