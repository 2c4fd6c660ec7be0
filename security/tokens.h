// Bearer tokens with roles. The collector's token file lists the tokens it accepts, one per line
// as "ROLE TOKEN" (ROLE: agent, may only report; reader, may only query); an agent's or
// stepwatchctl's token file holds the one token it sends. Both are re-read when the file changes,
// so tokens rotate without a restart.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace stepwatch::security {

enum class Role { kAgent, kReader };
const char* RoleName(Role role);  // "agent", "reader"

// Compares secrets in time independent of where the first difference is, so that response times
// do not reveal how much of a guess was right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Shortest token accepted: shorter ones are guessable.
inline constexpr size_t kMinTokenLength = 16;

// Identifies a version of a file: a rewrite or an atomic rename changes one of these.
struct FileVersion {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t mtime_nanos = 0;
  int64_t size = -1;
  bool operator==(const FileVersion& o) const {
    return dev == o.dev && ino == o.ino && mtime_nanos == o.mtime_nanos && size == o.size;
  }
};

struct RoleToken {
  Role role;
  std::string token;
};

// Parses a collector token file. InvalidArgument names the bad line.
absl::StatusOr<std::vector<RoleToken>> ParseTokenFile(absl::string_view text);

// The tokens a collector accepts. Thread-safe.
class TokenStore {
 public:
  // Reads the file now: an unreadable or malformed file fails here.
  static absl::StatusOr<std::unique_ptr<TokenStore>> Open(std::string path);

  // Whether `authorization` (the request's "authorization" metadata, "Bearer TOKEN") carries a
  // token of `role`. Unauthenticated when it is missing or unknown, PermissionDenied when the
  // token has another role. The file is re-read first when it changed; a file that became
  // malformed is logged and the previous tokens stay in force.
  absl::Status Check(absl::string_view authorization, Role role);

 private:
  explicit TokenStore(std::string path) : path_(std::move(path)) {}
  absl::Status Reload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  FileVersion version_ ABSL_GUARDED_BY(mu_);
  std::vector<RoleToken> tokens_ ABSL_GUARDED_BY(mu_);
  LogRateLimiter log_limiter_{1, std::chrono::minutes(1)};
};

// The token a client sends, re-read when its file changes. Thread-safe.
class TokenSource {
 public:
  static absl::StatusOr<std::unique_ptr<TokenSource>> Open(std::string path);
  // "Bearer TOKEN", from the newest readable version of the file.
  std::string AuthorizationHeader();

 private:
  explicit TokenSource(std::string path) : path_(std::move(path)) {}
  absl::Status Reload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  FileVersion version_ ABSL_GUARDED_BY(mu_);
  std::string header_ ABSL_GUARDED_BY(mu_);
  LogRateLimiter log_limiter_{1, std::chrono::minutes(1)};
};

}  // namespace stepwatch::security
