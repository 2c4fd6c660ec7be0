#include "http/http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/net.h"

namespace stepwatch::http {
namespace {

constexpr uint64_t kListenerId = 1;
constexpr uint64_t kWakeId = 2;
// Deadlines are checked this often: timeouts are precise to about this much.
constexpr std::chrono::milliseconds kSweepInterval(100);
// After a response that closes the connection, what the client still sends is read and dropped
// for at most this long, so that closing with unread data (a reset) cannot destroy the response.
constexpr std::chrono::milliseconds kLinger(2000);

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string ErrnoText(int err) { return std::strerror(err); }

absl::StatusOr<int> Listen(const std::string& address, int* port) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return absl::InvalidArgumentError(hp.status().message());
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = hp->host.empty() ? AF_INET : AF_UNSPEC;
  addrinfo* addresses = nullptr;
  const std::string service = absl::StrCat(hp->port);
  if (int rc = getaddrinfo(hp->host.empty() ? nullptr : hp->host.c_str(), service.c_str(), &hints,
                           &addresses);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* a = addresses; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = ErrnoText(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      error = ErrnoText(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(addresses);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", error));
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  *port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

}  // namespace

const char* CloseReasonName(CloseReason reason) {
  switch (reason) {
    case CloseReason::kPeer:
      return "peer";
    case CloseReason::kDone:
      return "done";
    case CloseReason::kHeaderTimeout:
      return "header_timeout";
    case CloseReason::kIdleTimeout:
      return "idle_timeout";
    case CloseReason::kWriteTimeout:
      return "write_timeout";
    case CloseReason::kEvicted:
      return "evicted";
    case CloseReason::kCount:
      break;
  }
  return "unknown";
}

struct HttpServer::Connection {
  enum class State {
    kReading,   // waiting for (the rest of) a request head
    kWaiting,   // the handler has the request
    kWriting,   // sending a response
    kLingering  // response sent, closing: reading and dropping what the client still sends
  };
  int fd = -1;
  uint64_t id = 0;
  State state = State::kReading;
  uint32_t events = 0;
  std::string in;
  size_t scanned = 0;         // bytes of `in` searched for the end of the head
  bool head_started = false;  // bytes of the next request have arrived
  Clock::time_point reading_since{};
  Clock::time_point deadline = Clock::time_point::max();
  CloseReason deadline_reason = CloseReason::kHeaderTimeout;
  bool keep_alive = false;
  bool head_only = false;
  std::string out_head;
  std::shared_ptr<const std::string> body;
  size_t sent = 0;
};

void HttpResponder::Send(HttpResponse response) const { server_->Post(id_, std::move(response)); }

HttpServer::HttpServer(const HttpServerOptions& options, Handler handler)
    : options_(options),
      header_timeout_(absl::ToChronoNanoseconds(options.header_timeout)),
      idle_timeout_(absl::ToChronoNanoseconds(options.idle_timeout)),
      write_timeout_(absl::ToChronoNanoseconds(options.write_timeout)),
      handler_(std::move(handler)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              Handler handler) {
  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(handler)));
  absl::StatusOr<int> fd = Listen(options.listen, &server->port_);
  if (!fd.ok()) return fd.status();
  server->listen_fd_ = *fd;
  server->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->epoll_fd_ < 0 || server->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("epoll/eventfd: ", ErrnoText(errno)));
  }
  epoll_event listener{EPOLLIN, {}};
  listener.data.u64 = kListenerId;
  epoll_event wake{EPOLLIN, {}};
  wake.data.u64 = kWakeId;
  if (epoll_ctl(server->epoll_fd_, EPOLL_CTL_ADD, server->listen_fd_, &listener) != 0 ||
      epoll_ctl(server->epoll_fd_, EPOLL_CTL_ADD, server->wake_fd_, &wake) != 0) {
    return absl::InternalError(absl::StrCat("epoll_ctl: ", ErrnoText(errno)));
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

HttpServer::~HttpServer() {
  Stop();
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_}) {
    if (fd >= 0) close(fd);
  }
}

void HttpServer::Stop() {
  {
    absl::MutexLock lock(&mailbox_mu_);
    stopped_ = true;
    mailbox_.clear();
  }
  stop_.store(true);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
}

HttpServerStats HttpServer::stats() const {
  HttpServerStats s;
  s.accepted = accepted_.load();
  s.refused = refused_.load();
  s.open = open_.load();
  for (size_t i = 0; i < closed_.size(); ++i) s.closed[i] = closed_[i].load();
  absl::MutexLock lock(&responses_mu_);
  s.responses = responses_;
  return s;
}

void HttpServer::Post(uint64_t id, HttpResponse response) {
  absl::MutexLock lock(&mailbox_mu_);
  if (stopped_) return;
  mailbox_.emplace_back(id, std::move(response));
  // Under the lock: once Stop() has run, nothing writes to the descriptor it may close.
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void HttpServer::Loop() {
  epoll_event events[128];
  Clock::time_point next_sweep = Clock::now() + kSweepInterval;
  while (!stop_.load()) {
    int timeout_ms = -1;
    if (!connections_.empty() || accept_paused_) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(next_sweep - Clock::now()).count() +
              1));
    }
    const int n = epoll_wait(epoll_fd_, events, 128, timeout_ms);
    if (n < 0 && errno != EINTR) {
      SW_LOG_ERROR << "metrics server: epoll_wait: " << ErrnoText(errno);
      break;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kListenerId) {
        Accept();
        continue;
      }
      if (id == kWakeId) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
        DrainMailbox();
        continue;
      }
      auto it = connections_.find(id);
      if (it == connections_.end()) continue;  // closed earlier in this round
      Connection* c = it->second.get();
      if (c->state == Connection::State::kWaiting) {
        // epoll reports errors and hang-ups even with no events asked for: the client is gone,
        // and waiting for its answer would spin the loop.
        if ((events[i].events & (EPOLLERR | EPOLLHUP)) != 0) Close(c, CloseReason::kPeer);
      } else if (c->state == Connection::State::kWriting) {
        OnWritable(c);
      } else if (c->state == Connection::State::kReading ||
                 c->state == Connection::State::kLingering) {
        OnReadable(c);
      }
    }
    const Clock::time_point now = Clock::now();
    if (now >= next_sweep) {
      Sweep(now);
      next_sweep = now + kSweepInterval;
    }
    if (accept_paused_ && now >= accept_resume_) {
      epoll_event listener{EPOLLIN, {}};
      listener.data.u64 = kListenerId;
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &listener);
      accept_paused_ = false;
    }
  }
  for (auto& [id, c] : connections_) close(c->fd);
  connections_.clear();
  open_.store(0);
}

void HttpServer::Accept() {
  // A bounded batch per wake-up, so that a connection flood cannot starve the other sockets.
  for (int i = 0; i < 64; ++i) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: make room, or stop accepting for a moment (the listener would
        // otherwise wake the loop in a busy circle).
        if (EvictOldestIdle()) continue;
        epoll_event none{0, {}};
        none.data.u64 = kListenerId;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &none);
        accept_paused_ = true;
        accept_resume_ = Clock::now() + kSweepInterval;
        SW_LOG_WARNING << "metrics server: accept: " << ErrnoText(errno) << "; pausing";
      }
      return;
    }
    accepted_.fetch_add(1);
    if (connections_.size() >= static_cast<size_t>(std::max(1, options_.max_connections)) &&
        !EvictOldestIdle()) {
      refused_.fetch_add(1);
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->id = next_id_++;
    c->reading_since = Clock::now();
    c->deadline = c->reading_since + header_timeout_;
    c->deadline_reason = CloseReason::kHeaderTimeout;
    Connection* raw = c.get();
    connections_.emplace(raw->id, std::move(c));
    open_.store(connections_.size());
    SetEvents(raw, EPOLLIN);
  }
}

bool HttpServer::EvictOldestIdle() {
  Connection* oldest = nullptr;
  for (auto& [id, c] : connections_) {
    const bool idle =
        c->state == Connection::State::kReading || c->state == Connection::State::kLingering;
    if (idle && (oldest == nullptr || c->reading_since < oldest->reading_since)) {
      oldest = c.get();
    }
  }
  if (oldest == nullptr) return false;
  Close(oldest, CloseReason::kEvicted);
  return true;
}

void HttpServer::SetEvents(Connection* c, uint32_t events) {
  if (c->events == events) return;
  epoll_event ev{events, {}};
  ev.data.u64 = c->id;
  // A connection starts with no events registered: add it on first use.
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev) != 0 && errno == ENOENT) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev);
  }
  c->events = events;
}

void HttpServer::Close(Connection* c, CloseReason reason) {
  // Counted before the client can see the close.
  closed_[static_cast<size_t>(reason)].fetch_add(1);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  close(c->fd);
  connections_.erase(c->id);
  open_.store(connections_.size());
}

void HttpServer::OnReadable(Connection* c) {
  char buffer[16384];
  const ssize_t n = recv(c->fd, buffer, sizeof(buffer), 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    Close(c, c->state == Connection::State::kLingering ? CloseReason::kDone : CloseReason::kPeer);
    return;
  }
  if (n < 0 || c->state == Connection::State::kLingering) return;
  c->in.append(buffer, static_cast<size_t>(n));
  ProcessInput(c);
}

void HttpServer::ProcessInput(Connection* c) {
  if (!c->head_started) {
    // Empty lines before a request are allowed (RFC 9112 2.2).
    const size_t first = c->in.find_first_not_of("\r\n");
    c->in.erase(0, first == std::string::npos ? c->in.size() : first);
    if (c->in.empty()) return;
    c->head_started = true;
    c->scanned = 0;
    if (c->deadline_reason == CloseReason::kIdleTimeout) {
      c->deadline = Clock::now() + header_timeout_;
      c->deadline_reason = CloseReason::kHeaderTimeout;
    }
  }
  const size_t end = FindHeadEnd(c->in, c->scanned);
  if (end == std::string::npos || end > options_.max_head_bytes) {
    if (c->in.size() > options_.max_head_bytes) {
      HttpResponse response;
      response.status = 431;
      response.close = true;
      c->keep_alive = false;
      c->head_only = false;
      StartResponse(c, std::move(response));
      return;
    }
    c->scanned = c->in.size();
    return;
  }
  HttpRequest request;
  const HeadParse parse = ParseRequestHead(absl::string_view(c->in).substr(0, end), &request);
  c->in.erase(0, end);
  c->scanned = 0;
  c->head_started = false;
  c->deadline = Clock::time_point::max();
  c->head_only = parse.ok && request.method == "HEAD";
  if (!parse.ok) {
    HttpResponse response;
    response.status = parse.status;
    response.close = true;
    response.body = std::make_shared<const std::string>(parse.error + "\n");
    c->keep_alive = false;
    StartResponse(c, std::move(response));
    return;
  }
  c->keep_alive = request.keep_alive;
  c->state = Connection::State::kWaiting;
  // Nothing is read while the handler works: a pipelined request waits in the socket.
  SetEvents(c, 0);
  handler_(request, HttpResponder(this, c->id));
}

void HttpServer::DrainMailbox() {
  std::vector<std::pair<uint64_t, HttpResponse>> mail;
  {
    absl::MutexLock lock(&mailbox_mu_);
    mail.swap(mailbox_);
  }
  for (auto& [id, response] : mail) {
    auto it = connections_.find(id);
    if (it == connections_.end() || it->second->state != Connection::State::kWaiting) continue;
    StartResponse(it->second.get(), std::move(response));
  }
}

void HttpServer::CountResponse(int status) {
  absl::MutexLock lock(&responses_mu_);
  ++responses_[status];
}

void HttpServer::StartResponse(Connection* c, HttpResponse response) {
  CountResponse(response.status);
  if (response.close) c->keep_alive = false;
  const size_t length = response.body == nullptr ? 0 : response.body->size();
  c->out_head =
      absl::StrCat("HTTP/1.1 ", response.status, " ", ReasonPhrase(response.status),
                   "\r\nContent-Type: ", response.content_type, "\r\nContent-Length: ", length,
                   c->keep_alive ? "\r\nConnection: keep-alive" : "\r\nConnection: close", "\r\n");
  for (const auto& [name, value] : response.headers) {
    absl::StrAppend(&c->out_head, name, ": ", value, "\r\n");
  }
  c->out_head += "\r\n";
  c->body = c->head_only ? nullptr : std::move(response.body);
  c->sent = 0;
  c->state = Connection::State::kWriting;
  c->deadline = Clock::now() + write_timeout_;
  c->deadline_reason = CloseReason::kWriteTimeout;
  OnWritable(c);
}

void HttpServer::OnWritable(Connection* c) {
  const size_t body_size = c->body == nullptr ? 0 : c->body->size();
  const size_t total = c->out_head.size() + body_size;
  while (c->sent < total) {
    iovec parts[2];
    int count = 0;
    if (c->sent < c->out_head.size()) {
      parts[count++] = {&c->out_head[c->sent], c->out_head.size() - c->sent};
    }
    if (body_size > 0) {
      const size_t body_sent = c->sent > c->out_head.size() ? c->sent - c->out_head.size() : 0;
      parts[count++] = {const_cast<char*>(c->body->data()) + body_sent, body_size - body_sent};
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = count;
    const ssize_t n = sendmsg(c->fd, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        SetEvents(c, EPOLLOUT);
        return;
      }
      Close(c, CloseReason::kPeer);
      return;
    }
    c->sent += static_cast<size_t>(n);
  }
  c->body.reset();
  c->out_head.clear();
  if (!c->keep_alive) {
    // Half-close and drop what the client still sends until it closes too: closing a socket with
    // unread data resets the connection, and a reset can destroy the response at the client.
    shutdown(c->fd, SHUT_WR);
    c->state = Connection::State::kLingering;
    c->reading_since = Clock::now();
    c->deadline = c->reading_since + kLinger;
    c->deadline_reason = CloseReason::kDone;
    SetEvents(c, EPOLLIN);
    return;
  }
  c->state = Connection::State::kReading;
  c->reading_since = Clock::now();
  c->deadline = c->reading_since + idle_timeout_;
  c->deadline_reason = CloseReason::kIdleTimeout;
  SetEvents(c, EPOLLIN);
  // A request the client sent before this response was complete (pipelining).
  if (!c->in.empty()) ProcessInput(c);
}

void HttpServer::Sweep(Clock::time_point now) {
  std::vector<Connection*> expired;
  for (auto& [id, c] : connections_) {
    if (now >= c->deadline) expired.push_back(c.get());
  }
  for (Connection* c : expired) Close(c, c->deadline_reason);
}

}  // namespace stepwatch::http
