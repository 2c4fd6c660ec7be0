#include "security/http_basic_auth.h"

#include <crypt.h>

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "security/tokens.h"

namespace stepwatch::security {

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

absl::Status BasicAuthUsers::Load() {
  absl::MutexLock lock(&mu_);
  return LoadLocked();
}

bool BasicAuthUsers::Verify(const std::string& user, const std::string& password) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = LoadLocked(); !s.ok()) {
    uint64_t suppressed = 0;
    if (log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "metrics basic auth file not reloaded, previous users stay: " << s;
    }
  }
  auto it = users_.find(user);
  if (it == users_.end()) return false;
  User& u = it->second;
  if (!u.verified.empty()) return ConstantTimeEquals(u.verified, password);
  // crypt_data is 32 KiB: on the heap, not on a worker's stack.
  auto data = std::make_unique<crypt_data>();
  const char* hashed = crypt_r(password.c_str(), u.hash.c_str(), data.get());
  if (hashed == nullptr || hashed[0] == '*' || !ConstantTimeEquals(hashed, u.hash)) return false;
  u.verified = password;
  return true;
}

absl::Status BasicAuthUsers::LoadLocked() {
  absl::StatusOr<std::string> text = ReadFile(path_, 1 << 20);
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  if (*text == loaded_text_) return absl::OkStatus();
  std::map<std::string, User> users;
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
    users[std::string(line.substr(0, colon))].hash = std::string(line.substr(colon + 1));
  }
  if (users.empty()) return absl::InvalidArgumentError(absl::StrCat(path_, ": no users"));
  users_ = std::move(users);
  loaded_text_ = *std::move(text);
  return absl::OkStatus();
}

}  // namespace stepwatch::security
