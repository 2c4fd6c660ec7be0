#include "common/net.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stepwatch {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  HostPort out;
  absl::string_view port_text;
  if (!address.empty() && address.front() == '[') {
    size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("address \"", address, "\": expected [IPv6]:PORT"));
    }
    out.host = std::string(address.substr(1, close - 1));
    port_text = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("address \"", address, "\": expected HOST:PORT"));
    }
    out.host = std::string(address.substr(0, colon));
    port_text = address.substr(colon + 1);
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\": port must be a number in 0..65535"));
  }
  out.port = port;
  return out;
}

std::string JoinHostPort(const HostPort& hp) {
  std::string host = hp.host.empty() ? "0.0.0.0" : hp.host;
  if (absl::StrContains(host, ':')) host = absl::StrCat("[", host, "]");
  return absl::StrCat(host, ":", hp.port);
}

}  // namespace stepwatch
