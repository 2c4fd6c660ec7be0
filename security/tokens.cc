#include "security/tokens.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/log.h"

namespace stepwatch::security {
namespace {

constexpr size_t kMaxTokenFileBytes = 1 << 20;

absl::StatusOr<FileVersion> Stat(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  FileVersion v;
  v.dev = st.st_dev;
  v.ino = st.st_ino;
  v.mtime_nanos = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  v.size = st.st_size;
  return v;
}

// The file's text when its version differs from `*seen` (nullopt when unchanged). `*changed_to`
// receives the new version; the caller records it once the text is accepted.
absl::StatusOr<std::optional<std::string>> ReadIfChanged(const std::string& path,
                                                         const FileVersion& seen,
                                                         FileVersion* changed_to) {
  absl::StatusOr<FileVersion> version = Stat(path);
  if (!version.ok()) return version.status();
  if (*version == seen) return std::optional<std::string>();
  absl::StatusOr<std::string> text = ReadFile(path, kMaxTokenFileBytes);
  if (!text.ok()) return text.status();
  *changed_to = *version;
  return std::optional<std::string>(*std::move(text));
}

bool ValidTokenChars(absl::string_view token) {
  for (char c : token) {
    if (c <= 0x20 || c >= 0x7f) return false;  // printable ASCII without spaces: a header value
  }
  return true;
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

const char* RoleName(Role role) { return role == Role::kAgent ? "agent" : "reader"; }

absl::StatusOr<std::vector<RoleToken>> ParseTokenFile(absl::string_view text) {
  std::vector<RoleToken> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": expected \"ROLE TOKEN\" (ROLE: agent or reader)"));
    }
    RoleToken t;
    if (fields[0] == "agent") {
      t.role = Role::kAgent;
    } else if (fields[0] == "reader") {
      t.role = Role::kReader;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": unknown role (agent or reader)"));
    }
    if (fields[1].size() < kMinTokenLength || !ValidTokenChars(fields[1])) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": a token is at least ",
                                                     kMinTokenLength,
                                                     " printable characters without spaces"));
    }
    t.token = std::string(fields[1]);
    out.push_back(std::move(t));
  }
  if (out.empty()) return absl::InvalidArgumentError("no tokens in the file");
  return out;
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Open(std::string path) {
  std::unique_ptr<TokenStore> store(new TokenStore(std::move(path)));
  absl::MutexLock lock(&store->mu_);
  if (absl::Status s = store->Reload(); !s.ok()) return s;
  return store;
}

absl::Status TokenStore::Reload() {
  FileVersion version;
  absl::StatusOr<std::optional<std::string>> text = ReadIfChanged(path_, version_, &version);
  if (!text.ok()) return text.status();
  if (!text->has_value()) return absl::OkStatus();
  absl::StatusOr<std::vector<RoleToken>> tokens = ParseTokenFile(**text);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", tokens.status().message()));
  }
  const bool first = version_.size < 0;
  version_ = version;
  tokens_ = *std::move(tokens);
  if (!first) SW_LOG_INFO << "reloaded " << tokens_.size() << " tokens from " << path_;
  return absl::OkStatus();
}

absl::Status TokenStore::Check(absl::string_view authorization, Role role) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Reload(); !s.ok()) {
    uint64_t suppressed = 0;
    if (log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "token file not reloaded, the previous tokens stay in force: " << s;
    }
  }
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(authorization, kBearer)) {
    return absl::UnauthenticatedError("missing bearer token");
  }
  absl::string_view token = authorization.substr(kBearer.size());
  bool role_mismatch = false;
  for (const RoleToken& t : tokens_) {
    if (!ConstantTimeEquals(t.token, token)) continue;
    if (t.role == role) return absl::OkStatus();
    role_mismatch = true;
  }
  if (role_mismatch) {
    return absl::PermissionDeniedError(absl::StrCat("token lacks the ", RoleName(role), " role"));
  }
  return absl::UnauthenticatedError("unknown bearer token");
}

absl::StatusOr<std::unique_ptr<TokenSource>> TokenSource::Open(std::string path) {
  std::unique_ptr<TokenSource> source(new TokenSource(std::move(path)));
  absl::MutexLock lock(&source->mu_);
  if (absl::Status s = source->Reload(); !s.ok()) return s;
  return source;
}

absl::Status TokenSource::Reload() {
  FileVersion version;
  absl::StatusOr<std::optional<std::string>> text = ReadIfChanged(path_, version_, &version);
  if (!text.ok()) return text.status();
  if (!text->has_value()) return absl::OkStatus();
  absl::string_view token;
  for (absl::string_view line : absl::StrSplit(**text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    token = line;
    break;
  }
  if (token.size() < kMinTokenLength || !ValidTokenChars(token)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": the first line must be a token of at least ", kMinTokenLength,
                     " printable characters without spaces"));
  }
  version_ = version;
  header_ = absl::StrCat("Bearer ", token);
  return absl::OkStatus();
}

std::string TokenSource::AuthorizationHeader() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Reload(); !s.ok()) {
    uint64_t suppressed = 0;
    if (log_limiter_.Allow(&suppressed)) {
      SW_LOG_WARNING << "token file not reloaded, the previous token stays in use: " << s;
    }
  }
  return header_;
}

}  // namespace stepwatch::security
