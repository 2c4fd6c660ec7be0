#include "agent/ingest_server.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stepwatch::agent {
namespace {

absl::Status ErrnoError(absl::string_view what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

// mkdir -p for the socket's parent directory.
absl::Status MakeParentDirectories(const std::string& socket_path, mode_t mode) {
  const size_t slash = socket_path.rfind('/');
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();
  const std::string dir = socket_path.substr(0, slash);
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) {
      return ErrnoError(absl::StrCat("cannot create directory ", prefix), errno);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  return absl::OkStatus();
}

sockaddr_un MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// Removes a socket file left behind by a process that is gone. A socket that still has a reader
// (another agent) or a path that is not a socket is never touched.
absl::Status RemoveStaleSocket(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError(absl::StrCat("cannot stat ", path), errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
  }
  const int probe = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return ErrnoError("socket", errno);
  const sockaddr_un addr = MakeAddress(path);
  const int rc = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(probe);
  if (rc == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat(path, " is in use by another process (is another agent running?)"));
  }
  if (err != ECONNREFUSED && err != ENOENT) {
    return ErrnoError(absl::StrCat("cannot probe ", path), err);
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError(absl::StrCat("cannot remove stale socket ", path), errno);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<IngestServer>> IngestServer::Start(
    const IngestServerOptions& options, Sink sink) {
  const std::string& path = options.socket_path;
  if (path.empty()) return absl::InvalidArgumentError("socket path is empty");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path is longer than ", sizeof(sockaddr_un{}.sun_path) - 1, " bytes: ", path));
  }
  if (options.receive_batch <= 0) return absl::InvalidArgumentError("receive_batch must be > 0");
  absl::Status st = MakeParentDirectories(path, options.directory_mode);
  if (!st.ok()) return st;
  st = RemoveStaleSocket(path);
  if (!st.ok()) return st;

  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  const sockaddr_un addr = MakeAddress(path);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(absl::StrCat("cannot bind ", path), err);
  }
  if (options.socket_group != static_cast<gid_t>(-1) &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), options.socket_group) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return ErrnoError(absl::StrCat("cannot give ", path, " to group ", options.socket_group), err);
  }
  if (::chmod(path.c_str(), options.socket_mode) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return ErrnoError(absl::StrCat("cannot chmod ", path), err);
  }
  const int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return ErrnoError("SO_PASSCRED", err);
  }
  // A large buffer absorbs bursts (all ranks finishing a step at once). FORCE needs
  // CAP_NET_ADMIN; without it the kernel caps the plain request at rmem_max.
  const int want = options.receive_buffer_bytes;
  if (want > 0 && ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof(want)) != 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof(want));
  }
  const int wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return ErrnoError("eventfd", err);
  }
  std::unique_ptr<IngestServer> server(new IngestServer(options, std::move(sink), fd, wake_fd));
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

IngestServer::IngestServer(const IngestServerOptions& options, Sink sink, int fd, int wake_fd)
    : options_(options),
      sink_(std::move(sink)),
      clock_(options.clock ? options.clock : &system_clock_),
      fd_(fd),
      wake_fd_(wake_fd),
      reject_log_limiter_(5, std::chrono::seconds(10)),
      owners_(options.owners) {
  socklen_t len = sizeof(granted_rcvbuf_);
  ::getsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &granted_rcvbuf_, &len);
}

IngestServer::~IngestServer() { Stop(); }

void IngestServer::Stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
  ::close(wake_fd_);
  ::unlink(options_.socket_path.c_str());
}

IngestStats IngestServer::stats() const {
  IngestStats s;
  s.datagrams_total = datagrams_.load(std::memory_order_acquire);
  s.events_accepted_total = accepted_.load(std::memory_order_relaxed);
  for (int i = 0; i < kRejectReasonCount; ++i) {
    s.rejected_total[i] = rejected_[i].load(std::memory_order_relaxed);
  }
  s.receive_errors_total = receive_errors_.load(std::memory_order_relaxed);
  return s;
}

void IngestServer::Run() {
  const int batch = options_.receive_batch;
  // One maximal buffer per slot; only the pages a datagram touches become resident.
  std::vector<char> buffers(static_cast<size_t>(batch) * kMaxDatagramBytes);
  constexpr size_t kControlBytes = CMSG_SPACE(sizeof(ucred));
  std::vector<char> control(static_cast<size_t>(batch) * kControlBytes);
  std::vector<iovec> iov(batch);
  std::vector<mmsghdr> msgs(batch);

  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (!stopping_.load(std::memory_order_relaxed)) {
    const int ready = ::poll(fds, 2, 1000);
    if (ready < 0 && errno != EINTR) {
      receive_errors_.fetch_add(1, std::memory_order_relaxed);
      SW_LOG_ERROR << "poll on " << options_.socket_path << " failed: " << std::strerror(errno);
      return;
    }
    if (ready <= 0 || !(fds[0].revents & POLLIN)) continue;
    // Drain what is queued, bounded so that a flood cannot starve the stop check.
    for (int round = 0; round < 256 && !stopping_.load(std::memory_order_relaxed); ++round) {
      for (int i = 0; i < batch; ++i) {
        iov[i] = {buffers.data() + static_cast<size_t>(i) * kMaxDatagramBytes, kMaxDatagramBytes};
        msghdr& h = msgs[i].msg_hdr;
        h = msghdr{};
        h.msg_iov = &iov[i];
        h.msg_iovlen = 1;
        h.msg_control = control.data() + static_cast<size_t>(i) * kControlBytes;
        h.msg_controllen = kControlBytes;
        msgs[i].msg_len = 0;
      }
      const int n = ::recvmmsg(fd_, msgs.data(), batch, MSG_DONTWAIT, nullptr);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          receive_errors_.fetch_add(1, std::memory_order_relaxed);
        }
        break;
      }
      for (int i = 0; i < n; ++i) {
        msghdr& h = msgs[i].msg_hdr;
        pid_t pid = 0;
        for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
          if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
            ucred cred;
            std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
            pid = cred.pid;
          }
        }
        Handle(static_cast<const char*>(iov[i].iov_base), msgs[i].msg_len,
               (h.msg_flags & MSG_TRUNC) != 0, pid);
      }
      if (n < batch) break;
    }
  }
}

void IngestServer::Handle(const char* data, size_t size, bool truncated, pid_t pid) {
  std::optional<Rejection> rejection;
  v1::StepEvent event;
  if (truncated) {
    rejection = Rejection{RejectReason::kTooLarge,
                          absl::StrCat("datagram exceeds ", kMaxDatagramBytes, " bytes")};
  } else {
    rejection = ParseStepEvent(absl::string_view(data, size), &event);
  }
  if (!rejection) {
    switch (owners_.Claim(event.job(), event.rank(), pid)) {
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
    }
  }
  if (rejection) {
    rejected_[static_cast<int>(rejection->reason)].fetch_add(1, std::memory_order_relaxed);
    // Counted after its verdict (release; Stats() loads with acquire): whoever sees N datagrams
    // also sees how each of the N was classified.
    datagrams_.fetch_add(1, std::memory_order_release);
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
  event.set_pid(pid);
  event.set_received_unix_nanos(clock_->NowUnixNanos());
  accepted_.fetch_add(1, std::memory_order_relaxed);
  datagrams_.fetch_add(1, std::memory_order_release);
  sink_(std::move(event));
}

}  // namespace stepwatch::agent
