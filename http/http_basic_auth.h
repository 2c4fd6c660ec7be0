// HTTP basic authentication for /metrics: users from a file of "USER:BCRYPT_HASH" lines (the format
// Prometheus' own web configuration and htpasswd -B use), re-read when it changes, and the parsing
// of an Authorization header. Verify() may cost a bcrypt hash (~0.25 s): call it off any event
// loop; VerifyCached() answers credentials verified before, on the loop.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"

namespace stepwatch::http {

struct BasicCredentials {
  std::string user;
  std::string password;
};

// The user and password of an "Authorization: Basic BASE64(USER:PASSWORD)" value; nullopt when the
// value is not well-formed basic credentials.
std::optional<BasicCredentials> ParseBasicAuthorization(absl::string_view value);

class BasicAuthUsers {
 public:
  struct Stats {
    uint64_t cached = 0;    // answered from the verdict cache, without bcrypt
    uint64_t verified = 0;  // bcrypt said yes
    uint64_t refused = 0;   // bcrypt said no, unknown user, or malformed credentials
  };

  explicit BasicAuthUsers(std::string path) : path_(std::move(path)) {}

  // Reads the file. InvalidArgument when it is unreadable, has a line that is not a bcrypt entry,
  // or has no users.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);

  // Cheap enough for an event loop (a SHA-256, a stat of the file, a map lookup): true when this
  // exact Authorization value was verified by bcrypt less than kVerdictTtl ago and the file has
  // not changed since. Never runs bcrypt, so a client already verified is never queued behind the
  // bcrypt work of failures. False means "ask Verify()", not "wrong".
  bool VerifyCached(absl::string_view authorization) ABSL_LOCKS_EXCLUDED(mu_);

  // True when the Authorization value holds a user's password. Re-reads the file first when it
  // changed (a broken file keeps the previous users; a new one empties the cache). Costs a bcrypt
  // hash (~0.25 s) for a known user, run without holding the lock, so concurrent failures do not
  // serialize; a success is remembered for VerifyCached().
  bool Verify(absl::string_view authorization) ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // How long a verified credential is answered from the cache, and how many are kept (the oldest
  // goes first): a handful of scrapers need a few entries; a flood of valid ones cannot grow it.
  static constexpr absl::Duration kVerdictTtl = absl::Minutes(10);
  static constexpr size_t kMaxCachedVerdicts = 256;

 private:
  struct FileId {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileId& o) const {
      return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  static FileId Stat(const std::string& path);

  absl::Status LoadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::string loaded_text_ ABSL_GUARDED_BY(mu_);
  FileId loaded_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> users_ ABSL_GUARDED_BY(mu_);  // user -> bcrypt hash
  // SHA-256 of an Authorization value -> when it was verified.
  std::map<std::string, absl::Time> verdicts_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  LogRateLimiter log_limiter_{1, std::chrono::minutes(1)};
};

}  // namespace stepwatch::http
