#include "agent/ingest_server.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/unix_socket.h"

namespace stepwatch::agent {
namespace {

absl::Status ErrnoError(absl::string_view what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

UnixSocketSpec SpecOf(const IngestServerOptions& options) {
  UnixSocketSpec spec;
  spec.directory_mode = options.directory_mode;
  spec.socket_mode = options.socket_mode;
  spec.group = options.socket_group;
  spec.backlog = options.max_connections;
  return spec;
}

bool AddToEpoll(int epoll_fd, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  return ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

// The sender's pid from a received message's SCM_CREDENTIALS; `fallback` when it has none.
// The message's own credentials (SCM_CREDENTIALS), else `fallback` (the connection's peer).
template <typename Peer>
Peer SenderOf(msghdr* h, Peer fallback) {
  for (cmsghdr* c = CMSG_FIRSTHDR(h); c != nullptr; c = CMSG_NXTHDR(h, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
      ucred cred;
      std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
      // pid 0: a sender outside our pid namespace; its uid is still told (mapped).
      if (cred.pid > 0) return Peer{cred.pid, cred.uid};
      if (fallback.pid == 0) fallback.uid = cred.uid;
    }
  }
  return fallback;
}

constexpr size_t kControlBytes = CMSG_SPACE(sizeof(ucred));

}  // namespace

std::optional<bool> PidNamespaceNested(absl::string_view status) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, "NSpid:")) continue;
    std::vector<absl::string_view> pids =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    return pids.size() > 1;
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<IngestServer>> IngestServer::Start(
    const IngestServerOptions& options, Sink sink) {
  if (options.socket_path.empty()) return absl::InvalidArgumentError("socket path is empty");
  if (options.receive_batch <= 0) return absl::InvalidArgumentError("receive_batch must be > 0");
  if (options.max_connections <= 0) {
    return absl::InvalidArgumentError("max_connections must be > 0");
  }
  if (options.seqpacket_path == options.socket_path) {
    return absl::InvalidArgumentError("the seqpacket socket needs a path of its own");
  }
  Fds fds;
  auto close_all = [&] {
    for (int fd : {fds.datagram, fds.seqpacket, fds.wake, fds.epoll}) {
      if (fd >= 0) ::close(fd);
    }
    if (fds.datagram >= 0) ::unlink(options.socket_path.c_str());
    if (fds.seqpacket >= 0) ::unlink(options.seqpacket_path.c_str());
  };
  absl::StatusOr<int> datagram = BindUnixSocket(SpecOf(options), options.socket_path, SOCK_DGRAM);
  if (!datagram.ok()) return datagram.status();
  fds.datagram = *datagram;
  if (!options.seqpacket_path.empty()) {
    absl::StatusOr<int> seqpacket =
        BindUnixSocket(SpecOf(options), options.seqpacket_path, SOCK_SEQPACKET);
    if (!seqpacket.ok()) {
      close_all();
      return seqpacket.status();
    }
    fds.seqpacket = *seqpacket;
  }
  // A large buffer absorbs bursts (all ranks finishing a step at once). FORCE needs
  // CAP_NET_ADMIN; without it the kernel caps the plain request at rmem_max.
  const int want = options.receive_buffer_bytes;
  if (want > 0 &&
      ::setsockopt(fds.datagram, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof(want)) != 0) {
    ::setsockopt(fds.datagram, SOL_SOCKET, SO_RCVBUF, &want, sizeof(want));
  }
  fds.wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fds.wake < 0) {
    const int err = errno;
    close_all();
    return ErrnoError("eventfd", err);
  }
  fds.epoll = ::epoll_create1(EPOLL_CLOEXEC);
  if (fds.epoll < 0 || !AddToEpoll(fds.epoll, fds.datagram) || !AddToEpoll(fds.epoll, fds.wake) ||
      (fds.seqpacket >= 0 && !AddToEpoll(fds.epoll, fds.seqpacket))) {
    const int err = errno;
    close_all();
    return ErrnoError("epoll", err);
  }
  std::unique_ptr<IngestServer> server(new IngestServer(options, std::move(sink), fds));
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

IngestServer::IngestServer(const IngestServerOptions& options, Sink sink, Fds fds)
    : options_(options),
      sink_(std::move(sink)),
      clock_(options.clock ? options.clock : &system_clock_),
      fds_(fds),
      reject_log_limiter_(5, std::chrono::seconds(10)),
      owners_(options.owners) {
  socklen_t len = sizeof(granted_rcvbuf_);
  ::getsockopt(fds_.datagram, SOL_SOCKET, SO_RCVBUF, &granted_rcvbuf_, &len);
  std::ifstream in(options_.proc_self_status);
  std::stringstream status;
  status << in.rdbuf();
  own_pid_namespace_ = PidNamespaceNested(status.str()).value_or(false);
  if (own_pid_namespace_) {
    // Said once, at start: what it costs is invisible later (events are still accepted).
    SW_LOG_WARNING << "the agent runs in a pid namespace of its own: training processes outside "
                      "it are seen with pid 0, so their ranks are not bound to their process "
                      "(forged steps are not refused), the --max-ranks-per-process and "
                      "--max-ranks-per-user bounds do not hold for them, and their exits are not "
                      "reported; run the agent in the host pid namespace (hostPID: true, "
                      "docker --pid=host). Events from unknown senders are counted in "
                      "stepwatch_agent_unknown_sender_events_total";
  }
}

IngestServer::~IngestServer() { Stop(); }

void IngestServer::Stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  ssize_t ignored = ::write(fds_.wake, &one, sizeof(one));
  (void)ignored;
  if (thread_.joinable()) thread_.join();
  for (const auto& [fd, pid] : connections_) ::close(fd);
  connections_.clear();
  connections_open_.store(0, std::memory_order_relaxed);
  ::close(fds_.datagram);
  ::unlink(options_.socket_path.c_str());
  if (fds_.seqpacket >= 0) {
    ::close(fds_.seqpacket);
    ::unlink(options_.seqpacket_path.c_str());
  }
  ::close(fds_.wake);
  ::close(fds_.epoll);
}

IngestStats IngestServer::stats() const {
  IngestStats s;
  s.datagrams_total = datagrams_.load(std::memory_order_acquire);
  s.seqpacket_messages_total = seqpacket_messages_.load(std::memory_order_acquire);
  s.events_accepted_total = accepted_.load(std::memory_order_relaxed);
  for (int i = 0; i < kRejectReasonCount; ++i) {
    s.rejected_total[i] = rejected_[i].load(std::memory_order_relaxed);
  }
  s.receive_errors_total = receive_errors_.load(std::memory_order_relaxed);
  s.connections_accepted_total = connections_accepted_.load(std::memory_order_relaxed);
  s.connections_refused_total = connections_refused_.load(std::memory_order_relaxed);
  s.connections_open = connections_open_.load(std::memory_order_relaxed);
  s.unknown_sender_events_total = unknown_sender_events_.load(std::memory_order_relaxed);
  s.own_pid_namespace = own_pid_namespace_;
  {
    absl::MutexLock lock(&tenant_mu_);
    for (const auto& [uid, n] : tenant_refusals_) {
      s.tenant_refusals_by_uid.emplace_back(absl::StrCat(uid), n);
    }
    if (tenant_refusals_other_ > 0)
      s.tenant_refusals_by_uid.emplace_back("other", tenant_refusals_other_);
    std::sort(s.tenant_refusals_by_uid.begin(), s.tenant_refusals_by_uid.end());
  }
  {
    absl::MutexLock lock(&drops_mu_);
    s.client_dropped_by_job.reserve(drops_by_job_.size());
    for (const auto& [job, d] : drops_by_job_) s.client_dropped_by_job.emplace_back(job, d.dropped);
  }
  std::sort(s.client_dropped_by_job.begin(), s.client_dropped_by_job.end());
  return s;
}

struct IngestServer::Buffers {
  explicit Buffers(int batch)
      : data(new char[static_cast<size_t>(batch) * kMaxDatagramBytes]),
        control(static_cast<size_t>(batch) * kControlBytes),
        iov(batch),
        msgs(batch) {}
  // One maximal buffer per slot, left uninitialised (not zero-filled) so that only the pages a
  // message touches become resident: a few MiB of address space, a few pages of memory.
  std::unique_ptr<char[]> data;
  std::vector<char> control;
  std::vector<iovec> iov;
  std::vector<mmsghdr> msgs;
};

void IngestServer::Run() {
  Buffers buffers(options_.receive_batch);
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (!stopping_.load(std::memory_order_relaxed)) {
    const int ready = ::epoll_wait(fds_.epoll, events, kMaxEvents, 1000);
    if (ready < 0) {
      if (errno == EINTR) continue;
      receive_errors_.fetch_add(1, std::memory_order_relaxed);
      SW_LOG_ERROR << "epoll_wait on " << options_.socket_path
                   << " failed: " << std::strerror(errno);
      return;
    }
    for (int i = 0; i < ready && !stopping_.load(std::memory_order_relaxed); ++i) {
      const int fd = events[i].data.fd;
      if (fd == fds_.wake) continue;
      if (fd == fds_.datagram) {
        DrainDatagrams(&buffers);
      } else if (fd == fds_.seqpacket) {
        Accept();
      } else if (auto it = connections_.find(fd); it != connections_.end()) {
        if (!DrainConnection(fd, it->second, buffers.data.get())) CloseConnection(fd);
      }
    }
  }
}

void IngestServer::DrainDatagrams(Buffers* b) {
  const int batch = options_.receive_batch;
  std::vector<iovec>& iov = b->iov;
  std::vector<mmsghdr>& msgs = b->msgs;
  // Drain what is queued, bounded so that a flood cannot starve the stop check or the
  // connections.
  for (int round = 0; round < 256 && !stopping_.load(std::memory_order_relaxed); ++round) {
    for (int i = 0; i < batch; ++i) {
      iov[i] = {b->data.get() + static_cast<size_t>(i) * kMaxDatagramBytes, kMaxDatagramBytes};
      msghdr& h = msgs[i].msg_hdr;
      h = msghdr{};
      h.msg_iov = &iov[i];
      h.msg_iovlen = 1;
      h.msg_control = b->control.data() + static_cast<size_t>(i) * kControlBytes;
      h.msg_controllen = kControlBytes;
      msgs[i].msg_len = 0;
    }
    const int n = ::recvmmsg(fds_.datagram, msgs.data(), batch, MSG_DONTWAIT, nullptr);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        receive_errors_.fetch_add(1, std::memory_order_relaxed);
      }
      return;
    }
    for (int i = 0; i < n; ++i) {
      msghdr& h = msgs[i].msg_hdr;
      Handle(static_cast<const char*>(iov[i].iov_base), msgs[i].msg_len,
             (h.msg_flags & MSG_TRUNC) != 0, SenderOf(&h, Peer{}), Transport::kDatagram);
    }
    if (n < batch) return;
  }
}

void IngestServer::Accept() {
  // Bounded, like the datagram drain; the listening socket stays readable if more wait.
  for (int round = 0; round < 64; ++round) {
    const int fd = ::accept4(fds_.seqpacket, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        receive_errors_.fetch_add(1, std::memory_order_relaxed);
        uint64_t suppressed = 0;
        if (reject_log_limiter_.Allow(&suppressed)) {
          SW_LOG_WARNING << "accept on " << options_.seqpacket_path
                         << " failed: " << std::strerror(errno);
        }
      }
      return;
    }
    if (connections_.size() >= static_cast<size_t>(options_.max_connections)) {
      // Accepted and closed at once: left in the backlog it would keep the socket readable.
      ::close(fd);
      connections_refused_.fetch_add(1, std::memory_order_relaxed);
      uint64_t suppressed = 0;
      if (reject_log_limiter_.Allow(&suppressed)) {
        SW_LOG_WARNING << "refused a connection on " << options_.seqpacket_path << ": "
                       << options_.max_connections << " are open";
      }
      continue;
    }
    // The connecting process; each message's own SCM_CREDENTIALS take precedence (a forked
    // child may send on its parent's connection).
    ucred peer{};
    socklen_t len = sizeof(peer);
    const Peer who = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0
                         ? Peer{peer.pid, peer.uid}
                         : Peer{};
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
    if (!AddToEpoll(fds_.epoll, fd)) {
      receive_errors_.fetch_add(1, std::memory_order_relaxed);
      ::close(fd);
      continue;
    }
    connections_.emplace(fd, who);
    connections_accepted_.fetch_add(1, std::memory_order_relaxed);
    connections_open_.store(connections_.size(), std::memory_order_relaxed);
  }
}

bool IngestServer::DrainConnection(int fd, Peer peer, char* buffer) {
  alignas(cmsghdr) char control[kControlBytes];
  // Bounded per wake-up so that one busy client cannot starve the others.
  for (int round = 0; round < 256; ++round) {
    iovec iov{buffer, kMaxDatagramBytes};
    msghdr h{};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = control;
    h.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &h, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno != ECONNRESET) receive_errors_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    // 0 is the end of the connection (an empty packet is not a step event either).
    if (n == 0 && (h.msg_flags & MSG_TRUNC) == 0) return false;
    Handle(buffer, static_cast<size_t>(n), (h.msg_flags & MSG_TRUNC) != 0, SenderOf(&h, peer),
           Transport::kSeqpacket);
  }
  return true;
}

void IngestServer::CloseConnection(int fd) {
  ::epoll_ctl(fds_.epoll, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  connections_.erase(fd);
  connections_open_.store(connections_.size(), std::memory_order_relaxed);
}

void IngestServer::CountClientDrops(const std::string& job, uint64_t dropped) {
  absl::MutexLock lock(&drops_mu_);
  const uint64_t seq = ++drop_sequence_;
  auto it = drops_by_job_.find(job);
  if (it == drops_by_job_.end()) {
    if (drops_by_job_.size() >= options_.max_drop_jobs) {
      auto oldest = drops_by_job_.begin();
      for (auto j = drops_by_job_.begin(); j != drops_by_job_.end(); ++j) {
        if (j->second.last_seen < oldest->second.last_seen) oldest = j;
      }
      if (oldest == drops_by_job_.end()) return;  // max_drop_jobs == 0
      drops_by_job_.erase(oldest);
    }
    it = drops_by_job_.emplace(job, JobDrops{}).first;
  }
  it->second.dropped += dropped;
  it->second.last_seen = seq;
}

void IngestServer::CountTenantRefusal(Peer peer, RankOwners::Verdict verdict) {
  bool first = false;
  {
    absl::MutexLock lock(&tenant_mu_);
    auto it = tenant_refusals_.find(peer.uid);
    if (it == tenant_refusals_.end()) {
      if (tenant_refusals_.size() >= options_.max_refused_users) {
        ++tenant_refusals_other_;
        return;
      }
      it = tenant_refusals_.emplace(peer.uid, 0).first;
      first = true;
    }
    ++it->second;
  }
  if (first) {
    const bool process = verdict == RankOwners::Verdict::kProcessLimit;
    SW_LOG_WARNING << "uid " << peer.uid << " (pid " << peer.pid << ") reached "
                   << (process ? "--max-ranks-per-process=" : "--max-ranks-per-user=")
                   << (process ? options_.owners.max_per_process : options_.owners.max_per_user)
                   << " (job, rank) pairs: its new ranks are refused while those processes run "
                      "(stepwatch_agent_tenant_refusals_total{uid=\""
                   << peer.uid << "\"}); other users are not affected";
  }
}

void IngestServer::Handle(const char* data, size_t size, bool truncated, Peer peer,
                          Transport transport) {
  const pid_t pid = peer.pid;
  std::atomic<uint64_t>& messages =
      transport == Transport::kDatagram ? datagrams_ : seqpacket_messages_;
  std::optional<Rejection> rejection;
  v1::StepEvent event;
  ClientReport report;
  if (truncated) {
    rejection = Rejection{RejectReason::kTooLarge,
                          absl::StrCat("message exceeds ", kMaxDatagramBytes, " bytes")};
  } else {
    rejection = ParseStepEvent(absl::string_view(data, size), &event, &report);
  }
  if (!rejection) {
    const RankOwners::Verdict verdict = owners_.Claim(event.job(), event.rank(), pid, peer.uid);
    switch (verdict) {
      case RankOwners::Verdict::kAccepted:
        break;
      case RankOwners::Verdict::kNotOwner:
        rejection = Rejection{
            RejectReason::kNotOwner,
            absl::StrCat("job ", event.job(), " rank ", event.rank(), " is reported by pid ",
                         owners_.Owner(event.job(), event.rank()), ", which still runs")};
        break;
      case RankOwners::Verdict::kFull:
        rejection = Rejection{RejectReason::kNotOwner,
                              "too many (job, rank) pairs of live processes on this node"};
        break;
      case RankOwners::Verdict::kProcessLimit:
        rejection = Rejection{RejectReason::kTenantLimit,
                              absl::StrCat("pid ", pid, " owns --max-ranks-per-process=",
                                           options_.owners.max_per_process, " (job, rank) pairs")};
        CountTenantRefusal(peer, verdict);
        break;
      case RankOwners::Verdict::kUserLimit:
        rejection = Rejection{RejectReason::kTenantLimit,
                              absl::StrCat("uid ", peer.uid, " owns --max-ranks-per-user=",
                                           options_.owners.max_per_user, " (job, rank) pairs")};
        CountTenantRefusal(peer, verdict);
        break;
    }
  }
  if (rejection) {
    rejected_[static_cast<int>(rejection->reason)].fetch_add(1, std::memory_order_relaxed);
    // Counted after its verdict (release; Stats() loads with acquire): whoever sees N messages
    // also sees how each of the N was classified.
    messages.fetch_add(1, std::memory_order_release);
    uint64_t suppressed = 0;
    if (reject_log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "rejected step event from pid " << pid << " ("
                     << RejectReasonName(rejection->reason) << "): " << rejection->detail
                     << (suppressed
                             ? absl::StrCat(" [", suppressed, " similar messages suppressed]")
                             : std::string());
    }
    return;
  }
  if (pid == 0 && unknown_sender_events_.fetch_add(1, std::memory_order_relaxed) == 0) {
    // Exact where the start-up check can miss (a container's own /proc shows one pid level).
    SW_LOG_WARNING << "a step event of job " << event.job()
                   << " came from a process the kernel cannot name in the agent's pid namespace "
                      "(pid 0): its rank is not bound to it, no tenant bound or exit tracking "
                      "applies; run the agent in the host pid namespace. Counted in "
                      "stepwatch_agent_unknown_sender_events_total; logged once";
  }
  event.set_pid(pid);
  event.set_received_unix_nanos(clock_->NowUnixNanos());
  // Every job gets its series, 0 included; only accepted events count (a forger cannot inflate
  // another job's figure).
  CountClientDrops(event.job(), report.dropped);
  accepted_.fetch_add(1, std::memory_order_relaxed);
  messages.fetch_add(1, std::memory_order_release);
  sink_(std::move(event));
}

}  // namespace stepwatch::agent
