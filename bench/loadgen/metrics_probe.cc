#include "bench/loadgen/metrics_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace stepwatch::loadgen {
namespace {

// The value of label `name` in a series' label block, or "" when absent.
std::string Label(absl::string_view labels, absl::string_view name) {
  const std::string key = absl::StrCat(name, "=\"");
  size_t pos = 0;
  while ((pos = labels.find(key, pos)) != absl::string_view::npos) {
    if (pos == 0 || labels[pos - 1] == '{' || labels[pos - 1] == ',') {
      const size_t start = pos + key.size();
      const size_t end = labels.find('"', start);
      if (end == absl::string_view::npos) return "";
      return std::string(labels.substr(start, end - start));
    }
    pos += key.size();
  }
  return "";
}

}  // namespace

MetricsView ParseMetrics(absl::string_view body) {
  MetricsView view;
  view.bytes = static_cast<int64_t>(body.size());
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (absl::StartsWith(line, "stepwatch_finding{")) {
      if (Label(line, "kind") != "straggler") continue;
      int rank = -1;
      if (absl::SimpleAtoi(Label(line, "rank"), &rank)) {
        view.stragglers.emplace(Label(line, "job"), rank);
      }
    } else if (absl::StartsWith(line, "stepwatch_job_last_step{")) {
      const size_t space = line.rfind(' ');
      double step = 0;
      if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &step)) {
        view.last_step[Label(line, "job")] = static_cast<int64_t>(step);
      }
    }
  }
  return view;
}

absl::StatusOr<MetricsView> ScrapeMetrics(const std::string& host_port, double timeout_s) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad metrics address ", host_port));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address must be IPv4: ", host_port));
  }
  const auto start = std::chrono::steady_clock::now();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_s);
  tv.tv_usec = static_cast<suseconds_t>((timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to ", host_port, " failed"));
  }
  const std::string request =
      absl::StrCat("GET /metrics HTTP/1.1\r\nHost: ", host_port, "\r\nConnection: close\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send failed");
  }
  std::string response;
  char buf[65536];
  size_t body_start = std::string::npos;
  int64_t content_length = -1;
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
    if (body_start == std::string::npos) {
      const size_t end = response.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      body_start = end + 4;
      for (absl::string_view h : absl::StrSplit(response.substr(0, end), "\r\n")) {
        if (absl::StartsWithIgnoreCase(h, "content-length:")) {
          absl::SimpleAtoi(absl::StripAsciiWhitespace(h.substr(15)), &content_length);
        }
      }
    }
    if (content_length >= 0 &&
        static_cast<int64_t>(response.size() - body_start) >= content_length) {
      break;
    }
  }
  close(fd);
  if (body_start == std::string::npos || !absl::StartsWith(response, "HTTP/1.1 200")) {
    return absl::UnavailableError(absl::StrCat("no 200 response from ", host_port));
  }
  MetricsView view = ParseMetrics(absl::string_view(response).substr(body_start));
  view.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return view;
}

}  // namespace stepwatch::loadgen
