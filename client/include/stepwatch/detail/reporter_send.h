// stepwatch C++ client: how the Reporter formats, queues and sends events (Encode, Send, the
// sender thread, connecting and dropping) and registers section names.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "stepwatch/client_record.h"
#include "stepwatch/client_reporter.h"
#include "stepwatch/detail/client_json.h"

namespace stepwatch {

inline size_t Reporter::Encode(const StepRecord& r, char* buf, size_t capacity,
                               uint64_t dropped) const noexcept {
  client_internal::Writer w{buf, buf + capacity};
  w.Raw(prefix_.data(), prefix_.size());
  w.Lit(",\"step\":");
  w.Int(r.step);
  w.Lit(",\"step_s\":");
  w.Double(r.step_s);
  if (r.data_s) {
    w.Lit(",\"data_s\":");
    w.Double(*r.data_s);
  }
  if (r.compute_s) {
    w.Lit(",\"compute_s\":");
    w.Double(*r.compute_s);
  }
  if (r.comm_s) {
    w.Lit(",\"comm_s\":");
    w.Double(*r.comm_s);
  }
  if (r.samples) {
    w.Lit(",\"samples\":");
    w.Int(*r.samples);
  }
  if (r.section_mask != 0) {
    // Names need no escaping: they are [A-Za-z0-9_.:/-] only.
    const int registered = section_count();
    w.Lit(",\"sections\":{");
    bool first = true;
    for (int id = 0; id < kMaxSections; ++id) {
      if ((r.section_mask & (1u << id)) == 0) continue;
      if (id >= registered) {
        w.ok = false;  // an id this reporter never gave out (Send() refuses such records)
        break;
      }
      if (!first) w.Lit(",");
      first = false;
      w.Lit("\"");
      w.Raw(section_names_[id].data(), section_names_[id].size());
      w.Lit("\":");
      w.Double(r.section_s[id]);
    }
    w.Lit("}");
  }
  if (dropped > 0) {
    w.Lit(",\"dropped\":");
    w.Int(static_cast<int64_t>(dropped));
  }
  w.Lit("}");
  return w.ok ? static_cast<size_t>(w.p - buf) : 0;
}

inline bool Reporter::Send(const StepRecord& record) noexcept {
  if (!ok()) {
    dropped_.fetch_add(1, std::memory_order_relaxed);  // nothing can ever report it
    return false;
  }
  if (const char* invalid = ValidateStepRecord(record)) {
    Drop(invalid, 0);
    return false;
  }
  if ((record.section_mask >> section_count()) != 0) {
    Drop("invalid step event: a section id this reporter did not give out", 0);
    return false;
  }
  if (!thread_.joinable()) {
    std::lock_guard<std::mutex> lock(io_mu_);
    return SendNowLocked(record);
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (size_ == ring_.size()) {
      if (warned_.load(std::memory_order_relaxed)) {
        // Hot path of a stalled sender: count, format nothing.
        CountDrop();
      } else {
        Drop("the stepwatch client's queue is full", 0);
      }
      return false;
    }
    ring_[(head_ + size_) % ring_.size()] = record;
    ++size_;
    ++enqueued_;
    wake = size_ == ring_.size() / 2 + 1;
  }
  if (wake) queue_cv_.notify_one();  // half full: send before the periodic flush
  return true;
}

inline bool Reporter::Flush(std::chrono::milliseconds timeout) noexcept {
  if (!thread_.joinable()) return true;
  std::unique_lock<std::mutex> lock(queue_mu_);
  const uint64_t target = enqueued_;
  flush_requested_ = true;
  queue_cv_.notify_one();
  return done_cv_.wait_for(lock, timeout, [&] { return handled_ >= target; });
}

inline std::string Reporter::last_error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return last_error_;
}

inline void Reporter::Run() noexcept {
  std::vector<StepRecord> batch;
  batch.reserve(ring_.size());
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (true) {
    queue_cv_.wait_for(lock, options_.flush_interval,
                       [&] { return stop_ || flush_requested_ || size_ > ring_.size() / 2; });
    flush_requested_ = false;
    batch.clear();
    for (; size_ > 0; --size_) {
      batch.push_back(ring_[head_]);
      head_ = (head_ + 1) % ring_.size();
    }
    const bool stopping = stop_;
    lock.unlock();
    if (!batch.empty()) {
      std::lock_guard<std::mutex> io(io_mu_);
      for (const StepRecord& r : batch) SendNowLocked(r);
    }
    lock.lock();
    handled_ += batch.size();
    done_cv_.notify_all();
    if (stopping && size_ == 0) return;
  }
}

inline int Reporter::Open(int type, const std::string& path) noexcept {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = ::socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (type == SOCK_SEQPACKET) {
    // Room for bursts; the default buffer still works when the request is refused.
    const int bytes = kSendBufferBytes;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

inline int Reporter::ConnectLocked() noexcept {
  if (fd_ >= 0) return fd_;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_connect_) return -2;
  next_connect_ = now + options_.reconnect_interval;
  // The seqpacket socket when the agent has one; else datagrams (an older agent).
  int fd = Open(SOCK_SEQPACKET, socket_path_ + kSeqpacketSuffix);
  Transport transport = Transport::kSeqpacket;
  if (fd < 0) {
    fd = Open(SOCK_DGRAM, socket_path_);
    transport = Transport::kDatagram;
  }
  if (fd < 0) {
    Drop("cannot reach the stepwatch agent", errno);
    return -1;
  }
  fd_ = fd;
  transport_.store(static_cast<int>(transport), std::memory_order_relaxed);
  return fd_;
}

inline bool Reporter::SendNowLocked(const StepRecord& record) noexcept {
  char buf[4096];
  // Drops since the last message that left ride along with this one.
  const uint64_t pending = unreported_.load(std::memory_order_relaxed);
  const size_t n = Encode(record, buf, sizeof(buf), pending);
  if (n == 0) {
    Drop("step event does not fit in a datagram", 0);
    return false;
  }
  const int fd = ConnectLocked();
  if (fd == -2) {
    CountDrop();  // the failed attempt recorded the reason
    return false;
  }
  if (fd < 0) return false;
  if (::send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(n)) {
    sent_.fetch_add(1, std::memory_order_relaxed);
    if (pending > 0) unreported_.fetch_sub(pending, std::memory_order_relaxed);
    return true;
  }
  const int err = errno;
  if (err == ECONNREFUSED || err == ENOTCONN || err == ENOENT || err == EBADF ||
      err == EDESTADDRREQ || err == EPIPE || err == ECONNRESET) {
    // The agent went away or restarted (or refused the connection): connect again on the next
    // event.
    ::close(fd_);
    fd_ = -1;
    transport_.store(static_cast<int>(Transport::kNone), std::memory_order_relaxed);
    next_connect_ = {};
  }
  Drop("sending to the stepwatch agent failed", err);
  return false;
}

inline void Reporter::Drop(const char* reason, int err) noexcept {
  CountDrop();
  if (warned_.load(std::memory_order_relaxed) && err == EAGAIN) return;  // hot path: agent busy
  char message[sizeof(last_error_)];
  if (err != 0) {
    std::snprintf(message, sizeof(message), "%s at %s: %s", reason, socket_path_.c_str(),
                  std::strerror(err));
  } else {
    std::snprintf(message, sizeof(message), "%s", reason);
  }
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    std::memcpy(last_error_, message, sizeof(message));
  }
  if (!warned_.exchange(true) && options_.warn_on_stderr) {
    std::fprintf(stderr,
                 "stepwatch: %s; step events are dropped (counted in Reporter::dropped()) until "
                 "it works. This warning is not repeated.\n",
                 message);
  }
}

inline int Reporter::SectionId(std::string_view name, const char** why) noexcept {
  const int known = section_count_.load(std::memory_order_acquire);
  for (int id = 0; id < known; ++id) {
    if (section_names_[id] == name) return id;
  }
  const char* invalid = ValidateSectionName(name);
  if (invalid == nullptr) {
    std::lock_guard<std::mutex> lock(sections_mu_);
    const int n = section_count_.load(std::memory_order_relaxed);
    for (int id = known; id < n; ++id) {
      if (section_names_[id] == name) return id;
    }
    if (n < kMaxSections) {
      try {
        section_names_[n].assign(name.data(), name.size());
      } catch (...) {
        if (why != nullptr) *why = "out of memory";
        return -1;
      }
      section_count_.store(n + 1, std::memory_order_release);
      return n;
    }
    invalid = "more than 16 section names on one reporter";
  }
  if (why != nullptr) *why = invalid;
  return -1;
}

inline void Reporter::WarnSection(std::string_view name, const char* why) noexcept {
  if (section_warned_.exchange(true) || !options_.warn_on_stderr) return;
  // The name as given, shortened and with anything unprintable as '?': it goes to a terminal.
  char shown[kMaxSectionNameBytes + 1];
  size_t n = 0;
  for (; n < name.size() && n < kMaxSectionNameBytes; ++n) {
    const unsigned char c = static_cast<unsigned char>(name[n]);
    shown[n] = c >= 0x20 && c < 0x7F ? static_cast<char>(c) : '?';
  }
  shown[n] = '\0';
  std::fprintf(stderr, "stepwatch: section \"%s%s\" ignored: %s. This warning is not repeated.\n",
               shown, name.size() > n ? "..." : "", why);
}

}  // namespace stepwatch
