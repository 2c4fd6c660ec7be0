// Loopback helpers for tests that start real servers.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace stepwatch::test {

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed). Another
// process can take it before the caller binds it; servers that accept port 0 are better tested so.
absl::StatusOr<int> FreeLoopbackPort();

struct HttpResponse {
  int status_code = 0;
  std::string head;  // the status line and the headers, without the blank line
  std::string body;
};

// GET http://127.0.0.1:port/path (HTTP/1.0, Connection: close): reads until the server closes.
// An error when connecting, sending or reading fails, times out, or the answer is not HTTP; any
// status code is returned as it came.
absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& path,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace stepwatch::test
