#include "http/http_basic_auth.h"

#include <crypt.h>
#include <sys/stat.h>

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "openssl/sha.h"
#include "security/tokens.h"

namespace stepwatch::http {

std::optional<BasicCredentials> ParseBasicAuthorization(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  const size_t space = value.find(' ');
  if (space == absl::string_view::npos ||
      !absl::EqualsIgnoreCase(value.substr(0, space), "basic")) {
    return std::nullopt;
  }
  std::string decoded;
  if (!absl::Base64Unescape(absl::StripLeadingAsciiWhitespace(value.substr(space + 1)), &decoded)) {
    return std::nullopt;
  }
  const size_t colon = decoded.find(':');
  if (colon == std::string::npos) return std::nullopt;
  return BasicCredentials{decoded.substr(0, colon), decoded.substr(colon + 1)};
}

namespace {

std::string Sha256(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

}  // namespace

BasicAuthUsers::FileId BasicAuthUsers::Stat(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return FileId{};
  return FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                static_cast<uint64_t>(st.st_size),
                static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

absl::Status BasicAuthUsers::Load() {
  absl::MutexLock lock(&mu_);
  return LoadLocked();
}

BasicAuthUsers::Stats BasicAuthUsers::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool BasicAuthUsers::VerifyCached(absl::string_view authorization) {
  const std::string key = Sha256(authorization);
  const FileId id = Stat(path_);
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  // A changed file may have removed the user: only Verify(), which re-reads it, may answer.
  if (!(id == loaded_id_)) return false;
  auto it = verdicts_.find(key);
  if (it == verdicts_.end()) return false;
  if (now - it->second > kVerdictTtl) {
    verdicts_.erase(it);
    return false;
  }
  ++stats_.cached;
  return true;
}

bool BasicAuthUsers::Verify(absl::string_view authorization) {
  std::optional<BasicCredentials> credentials = ParseBasicAuthorization(authorization);
  std::string hash;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = LoadLocked(); !s.ok()) {
      uint64_t suppressed = 0;
      if (log_limiter_.Allow(&suppressed)) {
        SW_LOG_WARNING << "metrics basic auth file not reloaded, previous users stay: " << s;
      }
    }
    auto it = credentials.has_value() ? users_.find(credentials->user) : users_.end();
    if (it == users_.end()) {
      ++stats_.refused;
      return false;
    }
    hash = it->second;
  }
  // Without the lock: a slow wrong password must not hold up anyone else.
  // crypt_data is 32 KiB: on the heap, not on a worker's stack.
  auto data = std::make_unique<crypt_data>();
  const char* hashed = crypt_r(credentials->password.c_str(), hash.c_str(), data.get());
  const bool ok =
      hashed != nullptr && hashed[0] != '*' && security::ConstantTimeEquals(hashed, hash);
  absl::MutexLock lock(&mu_);
  if (!ok) {
    ++stats_.refused;
    return false;
  }
  ++stats_.verified;
  // Only while the hash checked is still the user's (the file may have changed meanwhile).
  auto it = users_.find(credentials->user);
  if (it == users_.end() || it->second != hash) return true;
  if (verdicts_.size() >= kMaxCachedVerdicts) {
    auto oldest = verdicts_.begin();
    for (auto v = verdicts_.begin(); v != verdicts_.end(); ++v) {
      if (v->second < oldest->second) oldest = v;
    }
    verdicts_.erase(oldest);
  }
  verdicts_[Sha256(authorization)] = absl::Now();
  return true;
}

absl::Status BasicAuthUsers::LoadLocked() {
  // Stat first: a change after it leaves loaded_id_ stale, which only sends VerifyCached() here.
  const FileId id = Stat(path_);
  absl::StatusOr<std::string> text = ReadFile(path_, 1 << 20);
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  if (*text == loaded_text_) {
    loaded_id_ = id;
    return absl::OkStatus();
  }
  std::map<std::string, std::string> users;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    // bcrypt only: "$2b$", "$2y$" or "$2a$" hashes. Plain passwords are refused.
    if (colon == absl::string_view::npos || colon == 0 || line.substr(colon + 1, 2) != "$2" ||
        line.size() - colon - 1 < 59) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, " line ", line_number, ": expected USER:BCRYPT_HASH"));
    }
    users[std::string(line.substr(0, colon))] = std::string(line.substr(colon + 1));
  }
  if (users.empty()) return absl::InvalidArgumentError(absl::StrCat(path_, ": no users"));
  users_ = std::move(users);
  loaded_text_ = *std::move(text);
  loaded_id_ = id;
  verdicts_.clear();
  return absl::OkStatus();
}

}  // namespace stepwatch::http
