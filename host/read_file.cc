#include "host/read_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace stepwatch::host {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  // Bounded: the files read here are a few KiB; a runaway file must not exhaust memory.
  constexpr size_t kMaxBytes = 4 << 20;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string message = absl::StrCat(path, ": ", strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  std::string out;
  char buf[8192];
  while (out.size() < kMaxBytes) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat(path, ": ", strerror(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

}  // namespace stepwatch::host
