#include "common/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace stepwatch {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path, int err) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  return err == ENOENT ? absl::NotFoundError(msg) : absl::UnavailableError(msg);
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view data) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp, errno);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoError("cannot write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoError("cannot flush", tmp, err);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoError("cannot rename onto", path, err);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  std::string out;
  char buf[1 << 16];
  while (out.size() < max_bytes) {
    ssize_t n = read(fd, buf, std::min(sizeof(buf), max_bytes - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return ErrnoError("cannot read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

}  // namespace stepwatch
