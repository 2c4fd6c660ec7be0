#include "tests/testing/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stepwatch::test {
namespace {

// Closes the descriptor when the scope ends.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

sockaddr_in Loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

absl::Status Errno(const char* what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<int> FreeLoopbackPort() {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Errno("socket");
  sockaddr_in address = Loopback(0);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return Errno("bind");
  }
  socklen_t length = sizeof(address);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return Errno("getsockname");
  }
  return static_cast<int>(ntohs(address.sin_port));
}

absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& path,
                                     std::chrono::milliseconds timeout) {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Errno("socket");
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const sockaddr_in address = Loopback(port);
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return Errno(absl::StrCat("connect to port ", port).c_str());
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return Errno("send");
  }
  std::string response;
  char buffer[8192];
  while (true) {
    const ssize_t n = recv(fd.get(), buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) return Errno("recv");
    response.append(buffer, static_cast<size_t>(n));
  }
  const size_t end = response.find("\r\n\r\n");
  int code = 0;
  if (response.rfind("HTTP/1.", 0) != 0 || end == std::string::npos || response.size() < 12 ||
      !absl::SimpleAtoi(absl::string_view(response).substr(9, 3), &code)) {
    return absl::InternalError(absl::StrCat("not an HTTP answer: ", response.substr(0, 200)));
  }
  HttpResponse out;
  out.status_code = code;
  out.head = response.substr(0, end);
  out.body = response.substr(end + 4);
  return out;
}

}  // namespace stepwatch::test
