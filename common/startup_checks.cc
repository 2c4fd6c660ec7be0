#include "common/startup_checks.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace stepwatch {
namespace {

// strerror's text with a lower-case first letter, to follow "flag=value: ".
std::string Reason(int err) {
  std::string text = std::strerror(err);
  if (!text.empty()) text[0] = absl::ascii_tolower(static_cast<unsigned char>(text[0]));
  return text;
}

}  // namespace

absl::Status CheckCanListen(absl::string_view address) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  if (hp->port == 0) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(hp->port);
  const int rc =
      getaddrinfo(hp->host.empty() ? nullptr : hp->host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve \"", hp->host, "\": ", gai_strerror(rc)));
  }
  absl::Status status = absl::OkStatus();
  for (addrinfo* a = found; a != nullptr && status.ok(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;  // e.g. no IPv6 on this machine: the listener will skip it too
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      const int err = errno;
      status = err == EADDRINUSE ? absl::AlreadyExistsError(Reason(err))
                                 : absl::FailedPreconditionError(Reason(err));
    }
    close(fd);
  }
  freeaddrinfo(found);
  return status;
}

absl::Status EnsureWritableDirectory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("cannot create it: ", ec.message()));
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError("not a directory");
  }
  // Permissions alone do not tell (root, read-only mounts, ACLs): try creating a file.
  const std::string probe = absl::StrCat(dir, "/.stepwatch-write-check.", getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("not writable: ", Reason(errno)));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace stepwatch
