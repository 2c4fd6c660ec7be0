#include "tests/collector/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace stepwatch::collector::testing {

v1::ReportBatch EmptyBatch(const std::string& node, uint64_t seq) {
  v1::ReportBatch b;
  b.set_agent_id(absl::StrCat("agent-", node));
  b.set_boot_id("boot-1");
  b.set_seq(seq);
  b.set_base_seq(1);
  b.mutable_node()->set_node(node);
  b.mutable_node()->set_nvml_available(true);
  return b;
}

v1::ReportBatch StepBatch(const std::string& node, uint64_t seq, const std::string& job,
                          int world_size, int64_t step, double busy_seconds, int slow_rank,
                          double slow_busy_s) {
  v1::ReportBatch b = EmptyBatch(node, seq);
  const double max_busy = slow_rank >= 0 ? std::max(busy_seconds, slow_busy_s) : busy_seconds;
  const double step_seconds = max_busy + 0.005;
  for (int rank = 0; rank < world_size; ++rank) {
    v1::StepEvent* e = b.add_steps();
    const double busy = rank == slow_rank ? slow_busy_s : busy_seconds;
    e->set_job(job);
    e->set_rank(rank);
    e->set_world_size(world_size);
    e->set_step(step);
    e->set_step_seconds(step_seconds);
    e->set_data_seconds(0);
    e->set_compute_seconds(busy);
    e->set_comm_seconds(step_seconds - busy);
    e->set_samples(32);
    e->set_gpu(rank % 8);
  }
  return b;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to port ", port));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send");
  }
  std::string response;
  char buf[8192];
  ssize_t n = 0;
  do {
    n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) response.append(buf, static_cast<size_t>(n));
  } while (n > 0);
  close(fd);
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") == std::string::npos) {
    return absl::InternalError(absl::StrCat("bad answer: ", response.substr(0, 200)));
  }
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return absl::InternalError("no body");
  return response.substr(body + 4);
}

absl::StatusOr<std::string> PromtoolCheck(const std::string& exposition) {
#ifdef STEPWATCH_PROMTOOL
  char path[] = "/tmp/stepwatch-metrics-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("mkstemp");
  if (write(fd, exposition.data(), exposition.size()) != static_cast<ssize_t>(exposition.size())) {
    close(fd);
    unlink(path);
    return absl::InternalError("write");
  }
  close(fd);
  const std::string command = absl::StrCat(STEPWATCH_PROMTOOL, " check metrics < ", path, " 2>&1");
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) {
    unlink(path);
    return absl::InternalError("popen");
  }
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  unlink(path);
  if (rc != 0 && out.empty()) out = absl::StrCat("promtool exited with ", rc);
  return out;
#else
  return absl::UnavailableError("promtool not found at build time");
#endif
}

}  // namespace stepwatch::collector::testing
