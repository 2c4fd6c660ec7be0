// Parsing of an HTTP/1.x request head (request line and header fields), for the /metrics server.
// Strict where leniency would let a request mean two things: no whitespace before a colon, no
// folded lines, no control characters; bare LF line ends are accepted.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace stepwatch::http {

struct HttpRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;    // target without query, origin form ("/metrics")
  int minor_version = 1;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  bool keep_alive = true;

  // The value of the first header field `lower_name`, or nullptr.
  const std::string* Header(absl::string_view lower_name) const;
};

// Where the head that starts at buffer[0] ends: the offset just past its empty line, or npos when
// the buffer does not hold a whole head yet. `from` is where to resume a previous search.
size_t FindHeadEnd(absl::string_view buffer, size_t from = 0);

struct HeadParse {
  bool ok = false;
  int status = 400;   // the status to answer with when !ok: 400, 431 or 505
  std::string error;  // why, for the log
};

// Parses a whole head (as delimited by FindHeadEnd) into *request.
HeadParse ParseRequestHead(absl::string_view head, HttpRequest* request);

}  // namespace stepwatch::http
