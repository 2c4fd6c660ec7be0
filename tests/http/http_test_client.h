// A raw loopback HTTP client for the /metrics server tests: plain sockets, so that tests can send
// malformed, partial or slow requests and see exactly what comes back.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace stepwatch::http::testing {

// A connected socket to 127.0.0.1:port, closed on destruction; -1 when connecting failed.
class TestConnection {
 public:
  // receive_buffer > 0: a small socket buffer, for a client that reads slowly.
  explicit TestConnection(int port, int receive_buffer = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (receive_buffer > 0) {
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~TestConnection() {
    if (fd_ >= 0) close(fd_);
  }
  TestConnection(const TestConnection&) = delete;
  TestConnection& operator=(const TestConnection&) = delete;

  bool ok() const { return fd_ >= 0; }

  bool Send(const std::string& data) {
    return send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }

  // Reads until the peer closes or `timeout` passes; what arrived.
  std::string ReadUntilClose(std::chrono::milliseconds timeout, bool* closed = nullptr) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (closed != nullptr) *closed = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!WaitReadable(deadline)) break;
      char buffer[65536];
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        if (closed != nullptr) *closed = true;
        break;
      }
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }

  // Reads one response (head and a Content-Length body); empty when none came in time.
  std::string ReadResponse(std::chrono::milliseconds timeout, bool head_only = false) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      const size_t end = pending_.find("\r\n\r\n");
      if (end != std::string::npos) {
        size_t length = 0;
        const size_t at = pending_.find("Content-Length: ");
        if (at != std::string::npos && at < end) length = std::stoul(pending_.substr(at + 16));
        if (head_only) length = 0;
        if (pending_.size() >= end + 4 + length) {
          std::string response = pending_.substr(0, end + 4 + length);
          pending_.erase(0, end + 4 + length);
          return response;
        }
      }
      if (!WaitReadable(deadline)) break;
      char buffer[65536];
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      pending_.append(buffer, static_cast<size_t>(n));
    }
    return "";
  }

 private:
  bool WaitReadable(std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) > 0;
  }

  int fd_ = -1;
  std::string pending_;
};

inline std::string Get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + "\r\n";
}

}  // namespace stepwatch::http::testing
