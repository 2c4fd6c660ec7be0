// Address helpers shared by the binaries.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stepwatch {

struct HostPort {
  std::string host;  // without brackets for IPv6
  int port = 0;
};

// Parses "HOST:PORT", "[V6]:PORT" or ":PORT" (host empty). Port must be 0..65535.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// "HOST:PORT" as gRPC and the /metrics server take it: IPv6 hosts in brackets, an empty host as
// 0.0.0.0.
std::string JoinHostPort(const HostPort& hp);

}  // namespace stepwatch
