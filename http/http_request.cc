#include "http/http_request.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace stepwatch::http {
namespace {

// RFC 9110 token characters.
bool IsTokenChar(char c) {
  if (absl::ascii_isalnum(static_cast<unsigned char>(c))) return true;
  return absl::StrContains("!#$%&'*+-.^_`|~", c);
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// Field values: visible characters, spaces and tabs, and obs-text (bytes >= 0x80).
bool IsFieldValue(absl::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return false;
  }
  return true;
}

HeadParse Error(int status, std::string why) { return HeadParse{false, status, std::move(why)}; }

// "/path?query" -> "/path"; "http://host:port/path" -> "/path" (absolute form).
bool PathOf(absl::string_view target, std::string* path) {
  if (absl::StartsWithIgnoreCase(target, "http://") ||
      absl::StartsWithIgnoreCase(target, "https://")) {
    const size_t authority = target.find("//") + 2;
    const size_t slash = target.find('/', authority);
    target = slash == absl::string_view::npos ? absl::string_view("/") : target.substr(slash);
  }
  if (target.empty() || target[0] != '/') return false;
  *path = std::string(target.substr(0, target.find_first_of("?#")));
  return true;
}

}  // namespace

const std::string* HttpRequest::Header(absl::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return &value;
  }
  return nullptr;
}

size_t FindHeadEnd(absl::string_view buffer, size_t from) {
  // The head ends with an empty line: "\n\n" or "\n\r\n". Back up so that a terminator split
  // across two reads is found.
  size_t pos = from >= 2 ? from - 2 : 0;
  while ((pos = buffer.find('\n', pos)) != absl::string_view::npos) {
    if (pos + 1 < buffer.size() && buffer[pos + 1] == '\n') return pos + 2;
    if (pos + 2 < buffer.size() && buffer[pos + 1] == '\r' && buffer[pos + 2] == '\n') {
      return pos + 3;
    }
    ++pos;
  }
  return absl::string_view::npos;
}

HeadParse ParseRequestHead(absl::string_view head, HttpRequest* request) {
  *request = HttpRequest();
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  // The head ends with an empty line, so the split ends with two empty pieces.
  while (!lines.empty() && (lines.back().empty() || lines.back() == "\r")) lines.pop_back();
  if (lines.empty()) return Error(400, "empty request");
  for (absl::string_view& line : lines) {
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
  }

  // Request line: METHOD SP TARGET SP HTTP/1.x, single spaces.
  const std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3) return Error(400, "malformed request line");
  if (!IsToken(parts[0])) return Error(400, "malformed method");
  if (parts[1].empty() || !IsFieldValue(parts[1]) || absl::StrContains(parts[1], '\t')) {
    return Error(400, "malformed target");
  }
  const absl::string_view version = parts[2];
  if (version.size() != 8 || !absl::StartsWith(version, "HTTP/") || version[6] != '.' ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[5])) ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[7]))) {
    return Error(400, "malformed version");
  }
  if (version[5] != '1') return Error(505, "unsupported version");
  request->method = std::string(parts[0]);
  request->target = std::string(parts[1]);
  request->minor_version = version[7] - '0';
  if (!PathOf(parts[1], &request->path)) return Error(400, "target is not a path");

  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty()) return Error(400, "empty line inside the head");
    if (line[0] == ' ' || line[0] == '\t') return Error(400, "folded header line");
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return Error(400, "malformed header line");
    }
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (!IsFieldValue(value)) return Error(400, "control character in a header value");
    request->headers.emplace_back(absl::AsciiStrToLower(line.substr(0, colon)), std::string(value));
  }

  // A GET or HEAD has no body here: one would have to be read and skipped to keep the connection's
  // framing, and a body whose length is unclear is how requests get smuggled.
  if (request->Header("transfer-encoding") != nullptr) {
    return Error(400, "request with a chunked body");
  }
  if (const std::string* length = request->Header("content-length");
      length != nullptr && *length != "0") {
    return Error(400, "request with a body");
  }
  if (request->minor_version >= 1 && request->Header("host") == nullptr) {
    return Error(400, "HTTP/1.1 request without Host");
  }

  // Keep-alive: HTTP/1.1 unless "close"; HTTP/1.0 only with "keep-alive".
  request->keep_alive = request->minor_version >= 1;
  for (const auto& [name, value] : request->headers) {
    if (name != "connection") continue;
    for (absl::string_view option : absl::StrSplit(value, ',')) {
      option = absl::StripAsciiWhitespace(option);
      if (absl::EqualsIgnoreCase(option, "close")) request->keep_alive = false;
      if (absl::EqualsIgnoreCase(option, "keep-alive") && request->minor_version == 0) {
        request->keep_alive = true;
      }
    }
  }
  return HeadParse{true, 200, ""};
}

}  // namespace stepwatch::http
