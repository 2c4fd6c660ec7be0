#include "agent/unix_socket.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

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
// (another agent) or a path that is not a socket is never touched. `type` is the socket type the
// path is probed with (a live socket of another type answers EPROTOTYPE: in use, too).
absl::Status RemoveStaleSocket(const std::string& path, int type) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError(absl::StrCat("cannot stat ", path), errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
  }
  const int probe = ::socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (probe < 0) return ErrnoError("socket", errno);
  const sockaddr_un addr = MakeAddress(path);
  const int rc = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(probe);
  if (rc == 0 || err == EAGAIN || err == EPROTOTYPE) {
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

absl::StatusOr<int> BindUnixSocket(const UnixSocketSpec& spec, const std::string& path, int type) {
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path is longer than ", sizeof(sockaddr_un{}.sun_path) - 1, " bytes: ", path));
  }
  absl::Status st = MakeParentDirectories(path, spec.directory_mode);
  if (!st.ok()) return st;
  st = RemoveStaleSocket(path, type);
  if (!st.ok()) return st;
  const int fd = ::socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  const sockaddr_un addr = MakeAddress(path);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(absl::StrCat("cannot bind ", path), err);
  }
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return ErrnoError(what, err);
  };
  if (spec.group != static_cast<gid_t>(-1) &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), spec.group) != 0) {
    return fail(absl::StrCat("cannot give ", path, " to group ", spec.group));
  }
  if (::chmod(path.c_str(), spec.socket_mode) != 0) {
    return fail(absl::StrCat("cannot chmod ", path));
  }
  // Every message then carries its sender's pid (SCM_CREDENTIALS).
  const int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0) {
    return fail("SO_PASSCRED");
  }
  if (type == SOCK_SEQPACKET && ::listen(fd, std::min(spec.backlog, SOMAXCONN)) != 0) {
    return fail(absl::StrCat("cannot listen on ", path));
  }
  return fd;
}

}  // namespace stepwatch::agent
