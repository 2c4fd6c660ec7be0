// HTTP basic authentication for /metrics: users from a file of "USER:BCRYPT_HASH" lines (the format
// Prometheus' own web configuration and htpasswd -B use), re-read when it changes, and the parsing
// of an Authorization header. Verify() may cost a bcrypt hash (~0.25 s): call it off any event
// loop.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace stepwatch::security {

struct BasicCredentials {
  std::string user;
  std::string password;
};

// The user and password of an "Authorization: Basic BASE64(USER:PASSWORD)" value; nullopt when the
// value is not well-formed basic credentials.
std::optional<BasicCredentials> ParseBasicAuthorization(absl::string_view value);

class BasicAuthUsers {
 public:
  explicit BasicAuthUsers(std::string path) : path_(std::move(path)) {}

  // Reads the file. InvalidArgument when it is unreadable, has a line that is not a bcrypt entry,
  // or has no users.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);

  // True when `password` is the user's. Re-reads the file first when it changed (a broken file
  // keeps the previous users). A password that verified once is remembered (per user, until the
  // file changes) and compared in constant time, so bcrypt's cost is paid once, not per scrape.
  bool Verify(const std::string& user, const std::string& password) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct User {
    std::string hash;
    std::string verified;
  };

  absl::Status LoadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::string loaded_text_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, User> users_ ABSL_GUARDED_BY(mu_);
  LogRateLimiter log_limiter_{1, std::chrono::minutes(1)};
};

}  // namespace stepwatch::security
